"""Fuzz emitters for the ops of the op table the other groups never generate.

Found missing by listing the op table against the emitters (fifteenth session): 55 ops
that autoclust clusters had never met a random graph, where a held-out fuzzer would look
first. ops group:
  - emit_math_more: Acos/Asin (after Sin: [-1, 1], NaN for +-inf), Atanh (after Tanh: +-1
    is +-inf), Acosh (|x| + 1), Tan, Shrink (lambd, bias), PRelu (a slope broadcast from
    the right), Sum and Mean of one to four broadcasting operands;
  - emit_logical: comparisons and IsNaN/IsInf into And/Or/Xor/Not, back to floats through
    Where or Cast; bitwise And/Or/Xor/Not on int32/int64 (opset 18 on);
  - emit_pool: MaxPool and AveragePool, 1-D and 2-D (kernels up to 3, strides, pads,
    ceil_mode, count_include_pad, dilations, auto_pad), GlobalMaxPool/GlobalAveragePool;
  - emit_norm_more: BatchNormalization (inference), InstanceNormalization,
    LpNormalization (p 1 and 2), MeanVarianceNormalization over random axes;
  - emit_space: DepthToSpace (DCR, CRD) and SpaceToDepth;
  - emit_scatter: ScatterElements (unique indices, or a reduction) and ScatterND;
  - emit_misc: OneHot (negative indices), EyeLike, ConstantOfShape of a Shape, Size,
    ReverseSequence, Einsum (products, transposes, traces, reductions), Dropout in
    inference, Identity, CastLike, ConvTranspose, QuantizeLinear -> DequantizeLinear.
Shapes stay small; every output shape is computed here as the spec defines it (pools:
ceil_mode only where the rule that drops a last window starting in the right pad cannot
apply, so both readings agree).
"""

from __future__ import annotations

import math

import numpy as np
from autoclust.tools.fuzz.build import BOOL, ELEM, F32, I32, I64, Builder, Val, bshape
from autoclust.tools.fuzz.gen_index import _indices


def _exact(v: Val) -> bool:
    """Comparisons and rounding-sensitive ops read only values no legal ulp moves."""
    return v.rounding == 0 and not v.dynamic


# ---- elementwise ------------------------------------------------------------------------

def emit_math_more(b: Builder) -> None:
    a = b.pick()
    out = [(a.dtype, a.shape)]
    r = b.rng.random()
    if r < 0.45:
        op = str(b.rng.choice(["Acos", "Asin", "Atanh", "Acosh", "Tan"]))
        x = a
        if op in ("Acos", "Asin"):
            (x,) = b.node("Sin", [a.name], out)
        elif op == "Atanh":
            (x,) = b.node("Tanh", [a.name], out)
        elif op == "Acosh":
            x = b.safe_positive(a, 1.0)
        b.node(op, [x.name], out)
    elif r < 0.6:
        b.node("Shrink", [a.name], out, lambd=float(b.rng.uniform(0.0, 1.5)),
               bias=float(b.rng.uniform(-1.0, 1.0)))
    elif r < 0.75:
        shape = a.shape[int(b.rng.integers(0, len(a.shape) + 1)):]
        shape = tuple(1 if b.rng.random() < 0.4 else d for d in shape)
        slope = b.weight(shape, 0.5, a.dtype) if b.rng.random() < 0.6 else \
            b.new_input(shape, a.dtype)
        b.node("PRelu", [a.name, slope.name], out)
    else:
        parts = [a] + [b.partner(a) for _ in range(int(b.rng.integers(0, 4)))]
        shape = bshape(*[p.shape for p in parts])
        b.node(str(b.rng.choice(["Sum", "Mean"])), [p.name for p in parts],
               [(a.dtype, shape)])


def emit_logical(b: Builder) -> None:
    if b.rng.random() < 0.3 and b.opset >= 18:
        dtype = I64 if b.rng.random() < 0.5 else I32
        a = b.pick(dtype=dtype)
        if b.rng.random() < 0.25:
            b.node("BitwiseNot", [a.name], [(dtype, a.shape)])
            return
        c = b.partner(a)
        op = str(b.rng.choice(["BitwiseAnd", "BitwiseOr", "BitwiseXor"]))
        b.node(op, [a.name, c.name], [(dtype, bshape(a.shape, c.shape))])
        return
    a = b.pick(_exact)
    masks = []
    for _ in range(2):
        if b.rng.random() < 0.3:
            op = "IsNaN" if b.rng.random() < 0.6 or not b.has("IsInf", a.dtype) else "IsInf"
            masks += b.node(op, [a.name], [(BOOL, a.shape)])
        else:
            c = b.partner(a)
            if not _exact(c):
                return
            op = str(b.rng.choice(["Greater", "Less", "Equal", "GreaterOrEqual",
                                   "LessOrEqual"]))
            masks += b.node(op, [a.name, c.name], [(BOOL, bshape(a.shape, c.shape))])
    op = str(b.rng.choice(["And", "Or", "Xor"]))
    (m,) = b.node(op, [masks[0].name, masks[1].name],
                  [(BOOL, bshape(masks[0].shape, masks[1].shape))])
    if b.rng.random() < 0.3:
        (m,) = b.node("Not", [m.name], [(BOOL, m.shape)])
    if b.rng.random() < 0.5:
        b.node("Where", [m.name, a.name, b.const(np.array(0.5, a.dtype))],
               [(a.dtype, bshape(m.shape, a.shape))])
    else:
        b.node("Cast", [m.name], [(a.dtype, m.shape)], to=ELEM[a.dtype])


# ---- pooling ----------------------------------------------------------------------------

def _spatial_input(b: Builder, spatial: int) -> Val:
    """An [N, C, *spatial] float value: from the pool when one fits, else a new input."""
    def fits(v: Val) -> bool:
        return len(v.shape) == 2 + spatial and 0 not in v.shape and max(v.shape) <= 9
    cands = [v for v in b.pool if v.dtype == b.fdt and not v.dynamic and fits(v)]
    if cands and b.rng.random() < 0.6:
        return cands[int(b.rng.integers(len(cands)))]
    shape = (b.batch, int(b.rng.integers(1, 4))) + tuple(int(b.rng.integers(1, 8))
                                                         for _ in range(spatial))
    return b.new_input(shape)


def _pool_dim(b: Builder, n: int, k: int, s: int, d: int, auto: str, ceil: bool
              ) -> tuple[int, int, int] | None:
    """(pad begin, pad end, output length) of one pooled axis; None where the window does
    not fit or where ceil_mode's extra window would start in the right pad (onnxruntime
    and PyTorch drop such a window, older readings of the spec keep it)."""
    dk = (k - 1) * d + 1
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = -(-n // s)
        total = (out - 1) * s + dk - n
        if total < 0:  # the spec's formula has no max(0, .): onnxruntime raises
            return None
        small = total // 2
        pb, pe = (small, total - small) if auto == "SAME_UPPER" else (total - small, small)
        return pb, pe, out
    if auto == "VALID":
        return (0, 0, (n - dk) // s + 1) if n >= dk else None
    pb, pe = (int(b.rng.integers(0, k)) for _ in range(2))
    span = n + pb + pe - dk
    if span < 0:
        return None
    if not ceil:
        return pb, pe, span // s + 1
    out = -(-span // s) + 1
    return (pb, pe, out) if (out - 1) * s < n + pb else None


def emit_pool(b: Builder) -> None:
    spatial = 1 if b.rng.random() < 0.3 else 2
    x = _spatial_input(b, spatial)
    n, c, dims = x.shape[0], x.shape[1], x.shape[2:]
    if b.rng.random() < 0.2:
        op = str(b.rng.choice(["GlobalMaxPool", "GlobalAveragePool"]))
        b.node(op, [x.name], [(x.dtype, (n, c) + (1,) * spatial)])
        return
    op = "MaxPool" if b.rng.random() < 0.5 else "AveragePool"
    auto = str(b.rng.choice(["NOTSET"] * 5 + ["SAME_UPPER", "SAME_LOWER", "VALID"]))
    ceil = auto == "NOTSET" and b.rng.random() < 0.3
    kernel = [int(b.rng.integers(1, 4)) for _ in dims]
    strides = [int(b.rng.integers(1, 3)) for _ in dims]
    dilated = (op == "MaxPool" or b.opset >= 19) and not auto.startswith("SAME")
    dil = [int(b.rng.integers(1, 3)) if dilated and b.rng.random() < 0.3 else 1 for _ in dims]
    axes = [_pool_dim(b, nn, k, s, d, auto, ceil)
            for nn, k, s, d in zip(dims, kernel, strides, dil)]
    if any(a is None for a in axes):
        return
    attrs: dict = {"kernel_shape": kernel, "strides": strides}
    if auto == "NOTSET":
        attrs["pads"] = [a[0] for a in axes if a] + [a[1] for a in axes if a]
        attrs["ceil_mode"] = int(ceil)
    else:
        attrs["auto_pad"] = auto
    if max(dil) > 1:
        attrs["dilations"] = dil
    if op == "AveragePool" and b.rng.random() < 0.5:
        attrs["count_include_pad"] = 1
    shape = (n, c) + tuple(a[2] for a in axes if a)
    b.node(op, [x.name], [(x.dtype, shape)], **attrs)


# ---- normalization ----------------------------------------------------------------------

def emit_norm_more(b: Builder) -> None:
    r = b.rng.random()
    if r < 0.55:
        batch_norm = r < 0.3  # else InstanceNormalization, rank >= 3
        x = b.pick(lambda v: (2 if batch_norm else 3) <= len(v.shape) <= 4)
        if not (2 if batch_norm else 3) <= len(x.shape) <= 4:
            return
        if not batch_norm and x.dtype != F32 and 0 in x.shape:
            return  # onnxruntime 1.31 segfaults on the node after an empty float16 one
            # (after a float32 one too in some chains, 148/1653: the CLI's workers report it)
        c = x.shape[1]
        eps = float(b.rng.choice([1e-5, 1e-3, 0.1]))
        scale, bias = b.weight((c,), 1.0, x.dtype), b.weight((c,), 0.5, x.dtype)
        if batch_norm:
            mean = b.weight((c,), 0.5, x.dtype)
            var = b.const_val(np.abs(b.rng.standard_normal(c)).astype(x.dtype) + 0.1)
            b.node("BatchNormalization", [x.name, scale.name, bias.name, mean.name,
                                          var.name], [(x.dtype, x.shape)], epsilon=eps)
        else:
            b.node("InstanceNormalization", [x.name, scale.name, bias.name],
                   [(x.dtype, x.shape)], epsilon=eps)
    elif r < 0.8:
        x = b.pick(lambda v: len(v.shape) >= 1)
        axis = int(b.rng.integers(-len(x.shape), len(x.shape)))
        b.node("LpNormalization", [x.name], [(x.dtype, x.shape)], axis=axis,
               p=int(b.rng.choice([1, 2])))
    elif b.fdt == F32:  # float16: onnx's function body of MVN mixes float constants in
        x = b.pick(lambda v: len(v.shape) >= 1)
        rank = len(x.shape)
        axes = sorted(int(a) for a in b.rng.choice(rank, int(b.rng.integers(1, rank + 1)),
                                                  replace=False))
        b.node("MeanVarianceNormalization", [x.name], [(x.dtype, x.shape)], axes=axes)


# ---- layout -----------------------------------------------------------------------------

def emit_space(b: Builder) -> None:
    bs = int(b.rng.integers(1, 4))
    n, c = b.batch, int(b.rng.integers(1, 3))
    h, w = int(b.rng.integers(1, 4)), int(b.rng.integers(1, 4))
    if b.rng.random() < 0.5:
        x = b.new_input((n, c * bs * bs, h, w))
        mode = str(b.rng.choice(["DCR", "CRD"]))
        b.node("DepthToSpace", [x.name], [(x.dtype, (n, c, h * bs, w * bs))], blocksize=bs,
               mode=mode)
    else:
        x = b.new_input((n, c, h * bs, w * bs))
        b.node("SpaceToDepth", [x.name], [(x.dtype, (n, c * bs * bs, h, w))], blocksize=bs)


# ---- scatter ----------------------------------------------------------------------------

def emit_scatter(b: Builder) -> None:
    data = b.pick(lambda v: 1 <= len(v.shape) <= 3 and 0 not in v.shape)
    if b.rng.random() < 0.6:
        _scatter_elements(b, data)
    else:
        _scatter_nd(b, data)


def _scatter_elements(b: Builder, data: Val) -> None:
    rank = len(data.shape)
    axis = int(b.rng.integers(-rank, rank))
    d = data.shape[axis]
    ishape = tuple(int(b.rng.integers(1, n + 1)) for n in data.shape)
    # onnxruntime has no float16 kernel for the reductions
    reductions = ["none"] + (["add", "mul"] if b.opset >= 16 and data.dtype == F32 else []) + \
        (["max", "min"] if b.opset >= 18 and data.dtype == F32 else [])
    reduction = str(b.rng.choice(reductions))
    if reduction == "none":  # unique targets along the axis: the result is defined
        ax = axis % rank
        other = [s for i, s in enumerate(ishape) if i != ax]
        rows = np.stack([b.rng.permutation(d)[:ishape[ax]]
                         for _ in range(int(np.prod(other, dtype=np.int64)))])
        idx = np.moveaxis(rows.reshape(other + [ishape[ax]]), -1, ax)
        idx = np.where(b.rng.random(idx.shape) < 0.3, idx - d, idx)
    else:
        idx = _indices(b, ishape, d)
    updates = b.new_input(ishape, data.dtype)
    attrs = {"axis": axis} | ({"reduction": reduction} if reduction != "none" else {})
    b.node("ScatterElements", [data.name, b.const(idx.astype(I64)), updates.name],
           [(data.dtype, data.shape)], **attrs)


def _scatter_nd(b: Builder, data: Val) -> None:
    rank = len(data.shape)
    k = int(b.rng.integers(1, rank + 1))
    cells = int(np.prod(data.shape[:k]))
    m = int(b.rng.integers(1, min(cells, 4) + 1))
    flat = b.rng.permutation(cells)[:m]  # unique index tuples
    idx = np.stack(np.unravel_index(flat, data.shape[:k]), -1).astype(I64)
    neg = b.rng.random(idx.shape) < 0.3
    idx = np.where(neg, idx - np.array(data.shape[:k], I64), idx)
    updates = b.new_input((m,) + data.shape[k:], data.dtype)
    b.node("ScatterND", [data.name, b.const(idx), updates.name], [(data.dtype, data.shape)])


# ---- the rest ---------------------------------------------------------------------------

def emit_misc(b: Builder) -> None:
    fns = [_one_hot, _eye_like, _constant_of_shape, _size, _reverse_sequence, _einsum,
           _dropout_identity_castlike, _conv_transpose, _quantize]
    fns[int(b.rng.integers(len(fns)))](b)


def _one_hot(b: Builder) -> None:
    depth = int(b.rng.integers(1, 6))
    ishape = tuple(int(b.rng.integers(1, 4)) for _ in range(int(b.rng.integers(1, 3))))
    idx = b.rng.integers(-depth, depth, size=ishape).astype(I64)
    values = b.const(np.array(b.rng.standard_normal(2), b.fdt))
    axis = int(b.rng.integers(-len(ishape) - 1, len(ishape) + 1))
    pos = axis % (len(ishape) + 1)
    shape = ishape[:pos] + (depth,) + ishape[pos:]
    b.node("OneHot", [b.const(idx), b.const(np.array(depth, I64)), values],
           [(b.fdt, shape)], axis=axis)


def _eye_like(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) == 2)
    if len(a.shape) != 2:
        return
    k = int(b.rng.integers(-3, 4))
    (e,) = b.node("EyeLike", [a.name], [(a.dtype, a.shape)], k=k)
    b.node("Mul", [e.name, a.name], [(a.dtype, a.shape)])


def _constant_of_shape(b: Builder) -> None:
    a = b.pick()
    (s,) = b.node("Shape", [a.name], [(I64, (len(a.shape),))])
    value = np.array([b.rng.choice([0.0, -1.5, 3.0])], a.dtype)
    from onnx import numpy_helper
    (c,) = b.node("ConstantOfShape", [s.name], [(a.dtype, a.shape)],
                  value=numpy_helper.from_array(value))
    b.node("Add", [c.name, a.name], [(a.dtype, a.shape)])


def _size(b: Builder) -> None:
    a = b.pick()
    (s,) = b.node("Size", [a.name], [(I64, ())])
    (f,) = b.node("Cast", [s.name], [(a.dtype, ())], to=ELEM[a.dtype])
    b.node("Mul", [a.name, f.name], [(a.dtype, a.shape)])


def _reverse_sequence(b: Builder) -> None:
    x = b.pick(lambda v: len(v.shape) >= 2 and 0 not in v.shape[:2])
    if len(x.shape) < 2 or 0 in x.shape[:2]:
        return
    time_axis = int(b.rng.integers(0, 2))
    batch, steps = x.shape[1 - time_axis], x.shape[time_axis]
    lens = b.rng.integers(1, steps + 1, size=batch).astype(I64)
    b.node("ReverseSequence", [x.name, b.const(lens)], [(x.dtype, x.shape)],
           time_axis=time_axis, batch_axis=1 - time_axis)


def _einsum(b: Builder) -> None:
    i, j, k, n = (int(b.rng.integers(1, 5)) for _ in range(4))
    patterns = [("ij,jk->ik", [(i, j), (j, k)], (i, k)),
                ("bij,bjk->bik", [(n, i, j), (n, j, k)], (n, i, k)),
                ("ij->ji", [(i, j)], (j, i)), ("ii->i", [(i, i)], (i,)),
                ("ii", [(i, i)], ()), ("ij->", [(i, j)], ()), ("i,i->", [(i,), (i,)], ()),
                ("i,j->ij", [(i,), (j,)], (i, j)), ("bhqd,bhkd->bhqk",
                                                  [(1, n, i, j), (1, n, k, j)], (1, n, i, k)),
                ("ij,ij->i", [(i, j), (i, j)], (i,))]
    eq, shapes, out = patterns[int(b.rng.integers(len(patterns)))]
    ins = [b.new_input(s).name for s in shapes]
    b.node("Einsum", ins, [(b.fdt, out)], equation=eq)


def _dropout_identity_castlike(b: Builder) -> None:
    a = b.pick()
    r = b.rng.random()
    if r < 0.35:
        ins = [a.name] + ([b.const(np.array(0.3, a.dtype))] if b.rng.random() < 0.5 else [])
        b.node("Dropout", ins, [(a.dtype, a.shape)])
    elif r < 0.6:
        b.node("Identity", [a.name], [(a.dtype, a.shape)])
    elif b.opset >= 15:
        target = F32 if a.dtype != F32 else np.dtype("float16")
        like = b.const_val(np.zeros((1,), target))
        (c,) = b.node("CastLike", [a.name, like.name], [(target, a.shape)])
        b.node("CastLike", [c.name, a.name], [(a.dtype, a.shape)])


def _conv_transpose(b: Builder) -> None:
    x = _spatial_input(b, 2)
    n, c, h, w = x.shape
    m = int(b.rng.integers(1, 3))
    kh, kw = (int(b.rng.integers(1, 4)) for _ in range(2))
    s = [int(b.rng.integers(1, 3)) for _ in range(2)]
    d = [int(b.rng.integers(1, 3)) if b.rng.random() < 0.2 else 1 for _ in range(2)]
    pads = [int(b.rng.integers(0, k)) for k in (kh, kw, kh, kw)]
    # below the stride (the spec allows up to the dilation too; onnxruntime does not)
    outpad = [int(b.rng.integers(0, si)) if b.rng.random() < 0.3 else 0 for si in s]
    dims = [(nn - 1) * si - pads[a] - pads[a + 2] + (k - 1) * di + 1 + op
            for a, (nn, si, k, di, op) in enumerate(zip((h, w), s, (kh, kw), d, outpad))]
    if min(dims) < 1:
        return
    wt = b.weight((c, m, kh, kw), 1.0 / math.sqrt(c * kh * kw), x.dtype)
    ins = [x.name, wt.name] + ([b.weight((m,), 0.5, x.dtype).name]
                               if b.rng.random() < 0.5 else [])
    b.node("ConvTranspose", ins, [(x.dtype, (n, m, dims[0], dims[1]))], strides=s,
           pads=pads, dilations=d, output_padding=outpad, kernel_shape=[kh, kw])


def _quantize(b: Builder) -> None:
    if b.fdt != F32 or b.opset >= 21:  # 21: onnxruntime's QDQ propagation makes an
        return                           # invalid node behind an Unsqueeze
    a = b.pick()
    qtype = np.dtype("uint8") if b.rng.random() < 0.5 else np.dtype("int8")
    info = np.iinfo(qtype)
    scale = b.const(np.array(float(b.rng.choice([0.01, 0.05, 0.3, 1.0])), F32))
    zp = b.const(np.array(int(b.rng.integers(info.min // 2, info.max // 2 + 1)), qtype))
    (q,) = b.node("QuantizeLinear", [a.name, scale, zp], [(qtype, a.shape)])
    b.node("DequantizeLinear", [q.name, scale, zp], [(F32, a.shape)])


EMITTERS = [(emit_math_more, 1.5, "ops"), (emit_logical, 1.0, "ops"), (emit_pool, 1.0, "ops"),
            (emit_norm_more, 0.8, "ops"), (emit_space, 0.5, "ops"), (emit_scatter, 0.8, "ops"),
            (emit_misc, 1.5, "ops")]
