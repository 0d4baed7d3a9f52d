"""Models whose shapes depend on data: compilable work around NonZero, Unique and TopK."""

from __future__ import annotations

import onnx

from .writer import FLOAT, INT64, GraphWriter


def mixed_dynamic(width: int = 8, seed: int = 0) -> onnx.ModelProto:
    """Elementwise work feeding and fed by data-dependent ops, like detection post-processing.

    x -> Mul/Add/Relu/Neg/Exp (compilable); then NonZero(score > 0.5) -> Transpose -> Cast ->
    scale (box-index style), Unique of a rounded int tensor -> Cast -> scale, and TopK with
    a runtime k input -> Tanh/Mul/Add. Each data-dependent op has compilable work after it.
    """
    w = GraphWriter(seed)
    x = w.input("x", FLOAT, ["batch", width])
    k = w.input("k", INT64, [1], feed=f"int:1:{width + 1}")
    with w.scope("pre"):
        act = w.op("Relu", w.op("Add", w.op("Mul", x, w.const(1.5)), w.const(0.5)))
        score = w.op("Exp", w.op("Neg", act))  # in (0, 1]
        dense = w.op("Add", w.op("Mul", score, act), w.const(1.0))
    with w.scope("nonzero"):
        idx = w.op("NonZero", w.op("Greater", score, w.const(0.5)))  # [2, nnz]
        coords = w.op("Cast", w.op("Transpose", idx, perm=[1, 0]), to=FLOAT)
        coords = w.op("Add", w.op("Mul", coords, w.const(0.5)), w.const(1.0))
    with w.scope("unique"):
        bins = w.op("Cast", w.op("Round", w.op("Mul", act, w.const(2.0))), to=INT64)
        uniq, _, _, counts = w.op("Unique", bins, n_out=4, sorted=1)
        uniq_f = w.op("Cast", uniq, to=FLOAT)
        uniq_f = w.op("Add", w.op("Mul", uniq_f, w.op("Cast", counts, to=FLOAT)), w.const(0.25))
    with w.scope("topk"):
        values, indices = w.op("TopK", score, k, n_out=2, axis=-1, largest=1, sorted=1)
        top = w.op("Mul", w.op("Tanh", values), w.const(2.0))
        top = w.op("Add", top, w.op("Mul", w.op("Cast", indices, to=FLOAT), w.const(0.1)))
    w.output(dense, FLOAT, ["batch", width], "dense")
    w.output(coords, FLOAT, ["nnz", 2], "nonzero_coords")
    w.output(uniq_f, FLOAT, ["n_unique"], "unique_scaled")
    w.output(top, FLOAT, ["batch", "k"], "topk_scaled")
    return w.model("mixed_dynamic", {"batch": 2})
