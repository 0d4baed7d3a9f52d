"""The dump directory (--dump_to=DIR): enough for someone else to reproduce a bug.

    manifest.json                  versions, flags, platform, CPU
    clustering.txt / .dot / .html  every node: its cluster or why it has none
    cluster_NNNN.onnx              the cluster as a standalone model (onnxruntime, Netron)
    cluster_NNNN.inputs.npz        its first real inputs (--dump_inputs)
    cluster_NNNN.before_optimizations.txt, .after_optimizations.txt, .kernels.txt, .ll, .s
    cluster_NNNN.failure.txt       why it fell back to onnxruntime, when it did

File names are built from our own cluster names, sanitized again here; nothing is written
outside DIR. An unwritable DIR warns once and dumping stops; the run carries on.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import warnings
import zipfile
from typing import Any

import numpy as np

from autoclust.flags import Flags
from autoclust.report.dump_html import cluster_color
from autoclust.version import __version__

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def safe_name(name: str) -> str:
    """A file-name-safe version of `name` (no separators, no leading dots)."""
    cleaned = _SAFE.sub("_", name).lstrip(".") or "unnamed"
    return cleaned[:120]


def versions() -> dict[str, str]:
    import onnx
    import onnxruntime

    out = {"autoclust": __version__, "numpy": np.__version__,
           "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
           "python": sys.version.split()[0]}
    try:
        import llvmlite
        import llvmlite.binding as llvm
        out["llvmlite"] = llvmlite.__version__
        out["llvm"] = ".".join(map(str, llvm.llvm_version_info))
    except (ImportError, OSError):  # llvmlite missing or broken: the manifest says so
        out["llvmlite"] = "unavailable"
    return out


def cpu_info() -> dict[str, str]:
    info = {"machine": platform.machine(), "processor": platform.processor()}
    try:
        import llvmlite.binding as llvm
        info["llvm_cpu"] = llvm.get_host_cpu_name()
    except (ImportError, OSError):
        info["llvm_cpu"] = "unknown"
    return info


class Dumper:
    """Writes dump files under one directory."""

    def __init__(self, root: str, flags: Flags):
        self.root = os.path.abspath(root)
        self.flags = flags
        self.broken = False

    @classmethod
    def create(cls, root: str, flags: Flags) -> Dumper | None:
        """A Dumper for `root`, or None (with one warning) when it cannot be created."""
        try:
            os.makedirs(root, exist_ok=True)
            probe = os.path.join(root, ".autoclust_probe")
            with open(probe, "w") as f:
                f.write("ok")
            os.remove(probe)
        except OSError as exc:
            warnings.warn(f"autoclust: cannot write dumps to {root!r} ({exc}); not dumping",
                          RuntimeWarning, stacklevel=3)
            return None
        return cls(root, flags)

    def path(self, name: str) -> str:
        p = os.path.abspath(os.path.join(self.root, safe_name(name)))
        if os.path.dirname(p) != self.root:
            raise ValueError(f"dump path {name!r} escapes {self.root}")
        return p

    def write(self, name: str, data: str | bytes) -> None:
        if self.broken:
            return
        try:
            mode = "wb" if isinstance(data, bytes) else "w"
            with open(self.path(name), mode) as f:
                f.write(data)
        except OSError as exc:
            self.broken = True
            warnings.warn(f"autoclust: dump to {self.root!r} failed ({exc}); not dumping "
                          "any more", RuntimeWarning, stacklevel=3)

    # ---- what the session and runtime call ----------------------------------------------
    def write_plan(self, plan: Any, clusters: bool = True) -> None:
        """manifest.json and clustering.*; with `clusters`, each cluster as cluster_NNNN.onnx
        and its graph text (bisect leaves them out: BERT-base's one cluster is 440 MB)."""
        from autoclust import registry
        from autoclust.report import explain
        export_model = registry.importer("onnx").export_model
        manifest = {"versions": versions(), "flags": self.flags.as_dict(),
                    "flags_string": self.flags.to_string(), "platform": platform.platform(),
                    "cpu": cpu_info(), "model": plan.graph.name,
                    "clusters": [c.name for c in plan.clusters]}
        self.write("manifest.json", json.dumps(manifest, indent=2, default=str))
        self.write("clustering.txt", explain.explain_text(plan) + "\n")
        self.write("clustering.json", json.dumps(explain.explain_json(plan), indent=2))
        self.write("clustering.dot", to_dot(plan))
        self.write("clustering.html", to_html(plan))
        for c in plan.clusters if clusters else ():
            sub = plan.graph.extract(c.nodes, name=c.name)
            try:
                self.write(f"{c.name}.onnx", export_model(sub).SerializeToString())
            except Exception as exc:  # noqa: BLE001 - a dump problem must not stop the run
                self.write(f"{c.name}.export_error.txt", f"{type(exc).__name__}: {exc}\n")
            self.write(f"{c.name}.before_optimizations.txt", str(sub) + "\n")

    def write_inputs(self, name: str, input_names: list[str], arrays: list[np.ndarray]) -> None:
        """cluster_NNNN.inputs.npz keyed by input name: `dict(np.load(f))` is a feed."""
        if self.broken:
            return
        try:
            save_inputs(self.path(f"{name}.inputs.npz"), dict(zip(input_names, arrays)))
        except OSError as exc:
            self.broken = True
            warnings.warn(f"autoclust: cannot write inputs of {name} ({exc})", RuntimeWarning,
                          stacklevel=3)

    def write_compile(self, name: str, dumps: dict[str, str]) -> None:
        for suffix, text in dumps.items():
            if suffix in (".ll", ".s") and not self.flags.dump_llvm:
                continue
            self.write(f"{name}{suffix}", text)

    def write_failure(self, name: str, reason: str) -> None:
        self.write(f"{name}.failure.txt", reason + "\n")


def save_inputs(path: str, feeds: dict[str, np.ndarray]) -> None:
    """An .npz with one member per input name (any name: np.savez would choke on `file`)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, array in feeds.items():
            with zf.open(name + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(array), allow_pickle=False)


def load_inputs(path: str) -> dict[str, np.ndarray]:
    """Read a cluster_NNNN.inputs.npz back as {input name: array}.

    Reads both layouts: one member per input name (current) and the older `__names__` +
    `input_0`, `input_1`, ... members.
    """
    with np.load(path, allow_pickle=False) as data:
        if "__names__" in data.files:
            names = [str(n) for n in data["__names__"]]
            return {n: data[f"input_{i}"] for i, n in enumerate(names)}
        return {k: data[k] for k in data.files}


# ---- graph pictures ------------------------------------------------------------------
def _node_info(plan: Any) -> list[dict[str, Any]]:
    owner = {}
    for c in plan.clusters:
        for n in c.nodes:
            owner[n.name] = c
    rows = []
    for n in plan.graph.nodes:
        c = owner.get(n.name)
        rows.append({
            "name": n.name, "op": n.qualified_op,
            "cluster": c.name if c else None, "cid": c.id if c else -1,
            "inputs": [v.name for v in n.inputs if v is not None],
            "outputs": [f"{v.name}: {v.type_str()}" for v in n.outputs],
            "reason": plan.reasons.get(n.name, ""),
        })
    return rows


def to_dot(plan: Any) -> str:
    """Graphviz text: clusters as coloured subgraphs, unclustered nodes grey with reasons."""
    def q(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
    lines = ["digraph autoclust {", "  rankdir=TB;", "  node [shape=box, style=filled];"]
    rows = _node_info(plan)
    for c in plan.clusters:
        color = cluster_color(c.id)
        lines.append(f"  subgraph {q('cluster_' + c.name)} {{")
        lines.append(f"    label={q(c.name)}; style=filled; color={q(color)};")
        for r in rows:
            if r["cluster"] == c.name:
                lines.append(f"    {q(r['name'])} [label={q(r['op'])}, fillcolor=white];")
        lines.append("  }")
    for r in rows:
        if r["cluster"] is None:
            tip = q(r["reason"])
            lines.append(f"    {q(r['name'])} [label={q(r['op'])}, fillcolor=\"#dddddd\", "
                         f"tooltip={tip}];")
    producer = {}
    for n in plan.graph.nodes:
        for v in n.outputs:
            producer[v.name] = n.name
    for n in plan.graph.nodes:
        for v in n.inputs:
            if v is not None and v.name in producer:
                lines.append(f"  {q(producer[v.name])} -> {q(n.name)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_html(plan: Any) -> str:
    """A self-contained page (no network): the graph as SVG with a legend, cluster boxes,
    graph inputs/outputs and arrows; hover or click a node for its op, shapes and reason."""
    from autoclust.report import dump_html
    return dump_html.to_html(plan, _node_info(plan))
