"""A run onnxruntime answers whole where a cluster rejected what onnxruntime itself produced.

A cluster checks its inputs against the shapes our inference gave the model's values. An
input that an onnxruntime segment computed carries onnxruntime's shape, which can differ
from ours where onnxruntime departs from the ONNX spec: its ReduceMax over an empty axis
keeps the axis's 0 ([1, 4, 0]), where the spec and our inference say [1, 4, 1] (fuzz case
81/558, with ReduceMax left out of the clusters). The cluster then raised InvalidInputError
for feeds that plain onnxruntime runs. Such a run now goes to onnxruntime over the whole
model (the session measured placement uses), as it would without autoclust, with one
warning; where that session raises too, the cluster's own error stands, and so it does
for plans onnxruntime cannot run whole (custom ops, control flow, a division it would
crash on) and for clusters whose inputs are all the user's feeds (the feeds' fault, not
onnxruntime's). (--must_compile leaves no onnxruntime segment to make such a value.)
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from autoclust.errors import InvalidInputError


def whole_model_answer(runtime: Any, feeds: dict[str, np.ndarray], step: int,
                       exc: InvalidInputError) -> dict[str, np.ndarray]:
    """The graph outputs by name from onnxruntime over the whole model, or raise `exc`
    (the rejection by step `step`'s cluster) where the rule above does not apply."""
    runners = runtime.runners
    kinds = [type(r).__name__ for r in runners]  # runner.py's classes (it imports this module)
    produced = {name for r, kind in zip(runners[:step], kinds) if kind == "SegmentRunner"
                for name in r.output_names}
    runner = runners[step]
    if (runtime.is_body or kinds[step] != "ClusterRunner"
            or not produced.intersection(runner.input_names)
            or any(kind not in ("ClusterRunner", "SegmentRunner") or
                   (kind == "ClusterRunner" and r.unmeasurable()) for r, kind in zip(runners, kinds))):
        raise exc
    fed = {v.name: feeds[v.name] for v in runtime.graph.inputs if v.name in feeds}
    try:  # the session measured placement uses, built at its first call
        outs = runtime.whole_model_segment().run_feeds(fed)
    except Exception:  # noqa: BLE001 - onnxruntime refuses these feeds too: ours stands
        raise exc from None
    if not runtime.rescued:
        runtime.rescued = True
        warnings.warn(f"autoclust: {runner.name} rejected a value an onnxruntime segment "
                      f"computed ({exc}); onnxruntime ran the whole model for this run, "
                      "as it does without autoclust", RuntimeWarning, stacklevel=6)
    return dict(zip(runtime.output_names, outs))
