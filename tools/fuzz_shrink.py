"""Shrink a failing fuzz graph to a minimal one and write its repro bundle.

`shrink(model, feeds, still_fails)` repeats three kinds of edits while `still_fails`
holds, until none applies (a fixpoint):
  - keep fewer graph outputs;
  - cut a node: its outputs become graph inputs fed with the values onnxruntime computed
    for them (removes the node and, once dead, everything only it needed);
  - bypass a node: its output is replaced by one of its inputs of the same dtype and shape.
Dead nodes, unused inputs and initializers are dropped after every edit.
`write_bundle` writes model.onnx, inputs.npz, expected.npz and meta.json.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from autoclust.tools.fuzz_check import run_ort
from onnx import helper

Feeds = dict[str, np.ndarray]
Predicate = Callable[[onnx.ModelProto, Feeds], bool]


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def intermediate_values(model: onnx.ModelProto, feeds: Feeds) -> dict[str, np.ndarray]:
    """Every node output computed by onnxruntime (optimizations off), by name."""
    probe = _copy(model)
    names = [o for n in probe.graph.node for o in n.output if o]
    del probe.graph.output[:]
    probe.graph.output.extend([onnx.ValueInfoProto(name=n) for n in names])
    return dict(zip(names, run_ort(probe, feeds)))


def prune(model: onnx.ModelProto, feeds: Feeds) -> tuple[onnx.ModelProto, Feeds]:
    """Drop nodes no graph output needs, then unused graph inputs and initializers."""
    g = model.graph
    needed = {o.name for o in g.output}
    keep = []
    for node in reversed(g.node):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
    keep.reverse()
    out = _copy(model)
    del out.graph.node[:]
    out.graph.node.extend(keep)
    inputs = [v for v in g.input if v.name in needed]
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    inits = [t for t in g.initializer if t.name in needed]
    del out.graph.initializer[:]
    out.graph.initializer.extend(inits)
    return out, {k: v for k, v in feeds.items() if k in needed}


def _info(name: str, value: np.ndarray) -> onnx.ValueInfoProto:
    elem = helper.np_dtype_to_tensor_dtype(value.dtype)
    return helper.make_tensor_value_info(name, elem, list(value.shape))


def _cut(model: onnx.ModelProto, feeds: Feeds, index: int,
         values: dict[str, np.ndarray]) -> tuple[onnx.ModelProto, Feeds] | None:
    node = model.graph.node[index]
    if any(o not in values for o in node.output if o):
        return None
    out = _copy(model)
    del out.graph.node[index]
    new_feeds = dict(feeds)
    for o in node.output:
        if o:
            out.graph.input.append(_info(o, values[o]))
            new_feeds[o] = values[o]
    return out, new_feeds


def _bypasses(model: onnx.ModelProto, index: int,
              values: dict[str, np.ndarray], feeds: Feeds) -> list[onnx.ModelProto]:
    node = model.graph.node[index]
    if len(node.output) != 1 or node.output[0] not in values:
        return []
    out_name = node.output[0]
    want = values[out_name]
    known = {**values, **feeds, **{t.name: onnx.numpy_helper.to_array(t)
                                   for t in model.graph.initializer}}
    cands = []
    for i in dict.fromkeys(x for x in node.input if x):
        v = known.get(i)
        if v is None or v.dtype != want.dtype or v.shape != want.shape:
            continue
        m = _copy(model)
        del m.graph.node[index]
        for n in m.graph.node:
            for j, x in enumerate(n.input):
                if x == out_name:
                    n.input[j] = i
        for o in m.graph.output:
            if o.name == out_name:
                o.name = i
        cands.append(m)
    return cands


def _output_subsets(model: onnx.ModelProto) -> list[onnx.ModelProto]:
    outs = list(model.graph.output)
    if len(outs) <= 1:
        return []
    subsets = [[o] for o in outs] + [[o for o in outs if o is not drop] for drop in outs]
    cands = []
    for keep in subsets:
        m = _copy(model)
        del m.graph.output[:]
        m.graph.output.extend(keep)
        cands.append(m)
    return cands


def _one_step(model: onnx.ModelProto, feeds: Feeds,
              still_fails: Predicate) -> tuple[onnx.ModelProto, Feeds] | None:
    """The first smaller (model, feeds) that still fails, or None at a fixpoint."""
    for cand in _output_subsets(model):
        small = prune(cand, feeds)
        if still_fails(*small):
            return small
    try:
        values = intermediate_values(model, feeds)
    except Exception:  # noqa: BLE001 - onnxruntime cannot run it: only output edits
        return None
    for index in reversed(range(len(model.graph.node))):
        cands = [(c, feeds) for c in _bypasses(model, index, values, feeds)]
        cut = _cut(model, feeds, index, values)
        if cut is not None:
            cands.append(cut)
        for cand, cand_feeds in cands:
            small = prune(cand, cand_feeds)
            if still_fails(*small):
                return small
    return None


def shrink(model: onnx.ModelProto, feeds: Feeds, still_fails: Predicate,
           max_steps: int = 200) -> tuple[onnx.ModelProto, Feeds]:
    """A smaller model (and its feeds) for which `still_fails` still holds."""
    model, feeds = prune(model, feeds)
    for _ in range(max_steps):
        step = _one_step(model, feeds, still_fails)
        if step is None:
            break
        model, feeds = step
    return model, feeds


def versions() -> dict[str, str]:
    """Versions of everything that decides a fuzz result."""
    import llvmlite
    import onnxruntime

    import autoclust
    return {"autoclust": autoclust.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "numpy": np.__version__,
            "llvmlite": llvmlite.__version__, "python": sys.version.split()[0],
            "platform": platform.platform()}


def write_bundle(out_dir: str, model: onnx.ModelProto, feeds: Feeds,
                 meta: dict[str, Any]) -> str:
    """Write a repro bundle into out_dir; returns the folder."""
    os.makedirs(out_dir, exist_ok=True)
    onnx.save_model(model, os.path.join(out_dir, "model.onnx"))
    np.savez(os.path.join(out_dir, "inputs.npz"), **feeds)
    try:
        expected = run_ort(model, feeds)
        names = [o.name for o in model.graph.output]
        np.savez(os.path.join(out_dir, "expected.npz"), **dict(zip(names, expected)))
    except Exception as exc:  # noqa: BLE001 - onnxruntime may fail too: record it
        meta = {**meta, "expected_error": f"{type(exc).__name__}: {exc}"}
    meta = {**meta, "versions": versions(), "nodes": len(model.graph.node),
            "ops": [n.op_type for n in model.graph.node]}
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, default=str)
    return out_dir
