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

import html
import json
import os
import platform
import re
import sys
import warnings
from typing import Any

import numpy as np

from autoclust.flags import Flags

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
COLORS = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69",
          "#fccde5", "#bc80bd", "#ccebc5", "#ffed6f")


def safe_name(name: str) -> str:
    """A file-name-safe version of `name` (no separators, no leading dots)."""
    cleaned = _SAFE.sub("_", name).lstrip(".") or "unnamed"
    return cleaned[:120]


def versions() -> dict[str, str]:
    import onnx
    import onnxruntime

    import autoclust
    out = {"autoclust": autoclust.__version__, "numpy": np.__version__,
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
    def write_plan(self, plan: Any) -> None:
        from autoclust import explain
        from autoclust.importers.onnx import export_model
        manifest = {"versions": versions(), "flags": self.flags.as_dict(),
                    "flags_string": self.flags.to_string(), "platform": platform.platform(),
                    "cpu": cpu_info(), "model": plan.graph.name,
                    "clusters": [c.name for c in plan.clusters]}
        self.write("manifest.json", json.dumps(manifest, indent=2, default=str))
        self.write("clustering.txt", explain.explain_text(plan))
        self.write("clustering.json", json.dumps(explain.explain_json(plan), indent=2))
        self.write("clustering.dot", to_dot(plan))
        self.write("clustering.html", to_html(plan))
        for c in plan.clusters:
            sub = plan.graph.extract(c.nodes, name=c.name)
            try:
                self.write(f"{c.name}.onnx", export_model(sub).SerializeToString())
            except Exception as exc:  # noqa: BLE001 - a dump problem must not stop the run
                self.write(f"{c.name}.export_error.txt", f"{type(exc).__name__}: {exc}\n")
            self.write(f"{c.name}.before_optimizations.txt", str(sub) + "\n")

    def write_inputs(self, name: str, input_names: list[str], arrays: list[np.ndarray]) -> None:
        if self.broken:
            return
        try:
            named = {f"input_{i}": np.asarray(a) for i, a in enumerate(arrays)}
            with open(self.path(f"{name}.inputs.npz"), "wb") as f:
                np.savez(f, __names__=np.array(input_names), **named)
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


def load_inputs(path: str) -> dict[str, np.ndarray]:
    """Read a cluster_NNNN.inputs.npz back as {input name: array}."""
    with np.load(path, allow_pickle=False) as data:
        names = [str(n) for n in data["__names__"]]
        return {n: data[f"input_{i}"] for i, n in enumerate(names)}


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
        color = COLORS[c.id % len(COLORS)]
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


def _levels(plan: Any) -> dict[str, int]:
    level: dict[str, int] = {}
    producer = {v.name: n.name for n in plan.graph.nodes for v in n.outputs}
    for n in plan.graph.nodes:
        ins = [level[producer[v.name]] for v in n.inputs if v is not None and v.name in producer]
        level[n.name] = 1 + max(ins, default=-1)
    return level


def to_html(plan: Any) -> str:
    """A self-contained page (no network): the graph as SVG, clusters coloured; hovering
    shows a node's op, shapes and reason; clicking pins the details in a side panel."""
    rows = _node_info(plan)
    level = _levels(plan)
    per_level: dict[int, int] = {}
    pos = {}
    w, h, gap_x, gap_y = 150, 26, 20, 44
    for r in rows:
        lv = level[r["name"]]
        col = per_level.get(lv, 0)
        per_level[lv] = col + 1
        pos[r["name"]] = (20 + col * (w + gap_x), 20 + lv * gap_y)
    width = 40 + max(per_level.values(), default=1) * (w + gap_x)
    height = 40 + (max(per_level, default=0) + 1) * gap_y
    producer = {v.name: n.name for n in plan.graph.nodes for v in n.outputs}
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    for n in plan.graph.nodes:
        x2, y2 = pos[n.name]
        for v in n.inputs:
            if v is not None and v.name in producer:
                x1, y1 = pos[producer[v.name]]
                svg.append(f'<line x1="{x1 + w / 2}" y1="{y1 + h}" x2="{x2 + w / 2}" '
                           f'y2="{y2}" stroke="#999"/>')
    for i, r in enumerate(rows):
        x, y = pos[r["name"]]
        fill = COLORS[r["cid"] % len(COLORS)] if r["cid"] >= 0 else "#dddddd"
        tip = html.escape(f"{r['name']} ({r['op']})\n{r['cluster'] or r['reason']}\n"
                          + "\n".join(r["outputs"]))
        svg.append(f'<g class="n" data-i="{i}"><title>{tip}</title>'
                   f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="4" fill="{fill}" '
                   f'stroke="#333"/><text x="{x + 6}" y="{y + 17}" font-size="12">'
                   f'{html.escape(r["op"][:22])}</text></g>')
    svg.append("</svg>")
    data = json.dumps(rows).replace("</", "<\\/")
    summary = html.escape(f"{len(plan.clusters)} clusters, {len(rows)} nodes, "
                          f"{len(plan.reasons)} unclustered")
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>autoclust clustering</title>
<style>body{{font-family:sans-serif;margin:0;display:flex}}
#g{{flex:1;overflow:auto;height:100vh}} #p{{width:340px;padding:10px;border-left:1px solid #ccc;
height:100vh;overflow:auto;font-size:13px;white-space:pre-wrap}} g.n{{cursor:pointer}}</style>
</head><body><div id="g">{''.join(svg)}</div>
<div id="p"><b>{summary}</b>
Click a node for details. Grey nodes run in onnxruntime.</div>
<script>
const rows = {data};
function show(i) {{
  const r = rows[i];
  document.getElementById('p').textContent = r.name + '\\nop: ' + r.op + '\\n' +
    (r.cluster ? 'cluster: ' + r.cluster : 'not clustered: ' + r.reason) +
    '\\ninputs: ' + r.inputs.join(', ') + '\\noutputs:\\n  ' + r.outputs.join('\\n  ');
}}
document.querySelectorAll('g.n').forEach(g => {{
  g.addEventListener('click', () => show(+g.dataset.i));
  g.addEventListener('mouseenter', () => show(+g.dataset.i));
}});
</script></body></html>
"""
