"""Repro bundles and the files the debugging tools read and write.

A repro bundle (written by `autoclust minify` and `autoclust fuzz --out`) is a folder:

    model.onnx      the failing model, standalone (onnxruntime and Netron open it)
    inputs.npz      its inputs, keyed by input name
    expected.npz    onnxruntime's outputs on them (optimizations off), keyed by output name
    meta.json       what failed and how, the flags, versions of everything involved

`autoclust replay BUNDLE` reruns it. `load_target` reads any of the things the tools take:
a model file, a dumped cluster (DIR/cluster_NNNN with its .onnx and .inputs.npz) or a bundle.
"""

from __future__ import annotations

import json
import os
import platform
import zipfile
from typing import Any

import numpy as np
import onnx

from autoclust.errors import InvalidInputError, ModelLoadError

Feeds = dict[str, np.ndarray]


def save_arrays(path: str, arrays: Feeds) -> None:
    """An .npz keyed by the arrays' own names (any name: np.savez's keywords cannot be)."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, array in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(array), allow_pickle=False)


def load_arrays(path: str) -> Feeds:
    """Arrays of an .npz by name; also reads the older input_<i> + __names__ dump format."""
    with np.load(path, allow_pickle=False) as data:
        if "__names__" in data.files:
            names = [str(n) for n in data["__names__"]]
            return {n: data[f"input_{i}"] for i, n in enumerate(names)}
        return {k: data[k] for k in data.files}


def versions() -> dict[str, str]:
    """Versions of everything that decides a result, and the platform."""
    from autoclust.report import dump
    return {**dump.versions(), "platform": platform.platform()}


def run_ort(model: onnx.ModelProto, feeds: Feeds) -> list[np.ndarray]:
    """onnxruntime with graph optimizations off: the reference outputs."""
    from autoclust.tools.fuzz.check import run_ort as run
    return run(model, feeds)


def write_bundle(out_dir: str, model: onnx.ModelProto, feeds: Feeds,
                 meta: dict[str, Any], reference: bool = True) -> str:
    """Write a repro bundle into out_dir; returns the folder. reference=False: no
    expected.npz (onnxruntime crashes on the model: running it here would end the caller)."""
    os.makedirs(out_dir, exist_ok=True)
    onnx.save_model(model, os.path.join(out_dir, "model.onnx"))
    save_arrays(os.path.join(out_dir, "inputs.npz"), feeds)
    try:
        if not reference:
            raise RuntimeError("not run: onnxruntime crashes on this model")
        expected = run_ort(model, feeds)
        names = [o.name for o in model.graph.output]
        save_arrays(os.path.join(out_dir, "expected.npz"), dict(zip(names, expected)))
    except Exception as exc:  # noqa: BLE001 - onnxruntime may fail too: record it
        meta = {**meta, "expected_error": f"{type(exc).__name__}: {exc}"}
    meta = {**meta, "versions": versions(), "nodes": len(model.graph.node),
            "ops": [n.op_type for n in model.graph.node],
            "inputs": {k: f"{v.dtype}{list(v.shape)}" for k, v in feeds.items()}}
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, default=str)
    return out_dir


def resolve(path: str) -> tuple[str, str | None]:
    """(model file, inputs file or None) for a model, DIR/cluster_NNNN[.onnx] or a bundle."""
    if os.path.isdir(path):
        model = os.path.join(path, "model.onnx")
        if not os.path.exists(model):
            found = sorted(f.removesuffix(".onnx") for f in os.listdir(path)
                           if f.startswith("cluster_") and f.endswith(".onnx"))
            listing = ", ".join(found) if found else "none (is it a --dump_to directory?)"
            raise ModelLoadError(f"{path} is a directory; replay one cluster of it, "
                                 f"DIR/cluster_NNNN; dumped clusters: {listing} (a repro "
                                 f"bundle folder would hold model.onnx)")
        inputs = os.path.join(path, "inputs.npz")
        return model, inputs if os.path.exists(inputs) else None
    base = path.removesuffix(".inputs.npz").removesuffix(".onnx")
    model = path if path.endswith(".onnx") else base + ".onnx"
    if not os.path.exists(model):
        raise ModelLoadError(f"no model at {model} (no such model file and no dumped cluster "
                             "model)")
    inputs = base + ".inputs.npz"
    return model, inputs if os.path.exists(inputs) else None


def load_target(path: str, inputs: dict[str, str] | None = None,
                dims: dict[str, int] | None = None, seed: int = 0
                ) -> tuple[onnx.ModelProto, Feeds, str]:
    """(model, feeds, where the feeds came from) for a model, dumped cluster or bundle.

    `inputs` (name -> .npy file) come first; the rest are the saved ones when there are
    any, else generated (symbolic dims from `dims`, else as the given inputs have them).
    """
    from autoclust.importers.onnx import load_model_proto
    from autoclust.tools.run import generate_inputs
    model_path, inputs_path = resolve(path)
    model = load_model_proto(model_path)
    inputs = inputs or {}
    constants = {t.name for t in model.graph.initializer}
    known = [vi.name for vi in model.graph.input if vi.name not in constants]
    for name in inputs:
        if name not in known:
            raise InvalidInputError(f"--input {name}: the model has no input {name!r}; its "
                                    f"inputs are: {', '.join(sorted(known))}")
    given = {name: np.load(file, allow_pickle=False) for name, file in inputs.items()}
    rest = [n for n in known if n not in given]
    if not rest:
        return model, given, "inputs from --input"
    if inputs_path:
        feeds, source = load_arrays(inputs_path), f"saved inputs {inputs_path}"
    else:  # symbolic dims the given inputs fix are taken from them (seq from input_ids)
        dims = {**_dims_of(model, given), **(dims or {})}
        feeds = generate_inputs(model, dims, seed, skip=set(given))
        source = "generated inputs"
    if given:
        source += f" ({', '.join(rest)}; {', '.join(given)} from --input)"
    return model, {**feeds, **given}, source


def _dims_of(model: onnx.ModelProto, given: Feeds) -> dict[str, int]:
    """Symbolic dim name -> size, as the arrays in `given` have them."""
    dims = {}
    for vi in model.graph.input:
        if vi.name in given:
            shape = np.shape(given[vi.name])
            for axis, d in enumerate(vi.type.tensor_type.shape.dim):
                if d.dim_param and axis < len(shape):
                    dims[d.dim_param] = int(shape[axis])
    return dims


def shown(path: str) -> str:
    """`path` relative to the working directory when inside it, else absolute."""
    rel = os.path.relpath(path)
    return os.path.abspath(path) if rel.startswith("..") else rel


def flags_text(flags: dict[str, Any]) -> str:
    """Flag overrides as an AUTOCLUST_FLAGS / --flags string."""
    parts = []
    for name, value in sorted(flags.items()):
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        elif isinstance(value, bool):
            value = "true" if value else "false"
        parts.append(f"--{name}={value}")
    return " ".join(parts)
