"""Fuzz emitters for indexing and layout ops, and the patterns real exports use.

index group:
  - Gather (negative and edge indices, constant or runtime, int32/int64) and
    GatherElements (indices smaller than data on non-axis dims); in error profiles a
    runtime index is out of range, where onnxruntime raises;
  - Pad: constant (negative pads too), reflect, edge and (opset 21) wrap, with zero dims;
  - Split (sizes input, equal split, num_outputs; zero-size chunks), Tile (0 repeats),
    Trilu (k, upper), Range (int and float; a float step with an inexact count only
    feeds an output).
export group: embedding lookups with position ids, GroupNormalization, nested Where
chains, Softmax over a mask (Where with -inf / a large negative, or an additive mask),
and vision models' Convs: depthwise (group = channels, stride 1, any pads, the weights
sometimes a graph input; generated code on the CPU), tiling (kernel = strides, no pads: a
MatMul over the patches) and strided or dilated ones (onnxruntime's), now and then behind
a channels-last Transpose and LayerNormalization as in ConvNeXt.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from autoclust.tools.fuzz.build import BOOL, ELEM, F16, F32, I32, I64, Builder, Val, bshape


def _indices(b: Builder, shape: tuple[int, ...], d: int) -> np.ndarray:
    """Valid indices into a dim of size d: negative ones and both edges included."""
    if d == 0:
        return np.zeros(shape, I64)
    idx = b.rng.integers(-d, d, size=shape)
    if idx.size and b.rng.random() < 0.5:
        idx.flat[int(b.rng.integers(idx.size))] = int(b.rng.choice([-d, d - 1, -1, 0]))
    return idx


def _index_operand(b: Builder, idx: np.ndarray, d: int) -> Val:
    """Indices as a constant or a runtime input (out of range in error profiles)."""
    dtype = I64 if b.rng.random() < 0.7 else I32
    if b.rng.random() < 0.5:
        return b.const_val(idx.astype(dtype))
    idx = idx.astype(dtype)
    if b.profile.errors and idx.size and b.rng.random() < 0.3:
        idx.flat[int(b.rng.integers(idx.size))] = int(b.rng.choice([d, -d - 1, d + 7]))
    v = b.new_input(idx.shape, dtype, idx)
    v.dynamic = True  # indices are not data for other emitters
    b.used.add(v.name)
    return v


def emit_gather(b: Builder) -> None:
    dtype = b.fdt if b.rng.random() < 0.8 else I64
    a = b.pick(lambda v: len(v.shape) >= 1, dtype)
    axis = int(b.rng.integers(-len(a.shape), len(a.shape)))
    d = a.shape[axis]
    ishape = tuple(int(x) for x in b.rng.integers(1, 4, size=int(b.rng.integers(0, 3))))
    if d == 0:
        ishape = ishape[:-1] + (0,) if ishape else (0,)
    idx = _index_operand(b, _indices(b, ishape, d), d)
    ax = axis % len(a.shape)
    shape = a.shape[:ax] + idx.shape + a.shape[ax + 1:]
    b.node("Gather", [a.name, idx.name], [(dtype, shape)], axis=axis)


def emit_gather_elements(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1)
    axis = int(b.rng.integers(-len(a.shape), len(a.shape)))
    ax = axis % len(a.shape)
    d = a.shape[ax]
    # Non-axis dims of the indices may be smaller than the data's (even 0).
    ishape = tuple((0 if d == 0 else int(b.rng.integers(1, d + 3))) if i == ax
                   else int(b.rng.integers(0 if b.profile.empty else min(1, n), n + 1))
                   for i, n in enumerate(a.shape))
    idx = _index_operand(b, _indices(b, ishape, d), d)
    b.node("GatherElements", [a.name, idx.name], [(a.dtype, ishape)], axis=axis)


def _pad_amounts(b: Builder, mode: str, d: int) -> tuple[int, int]:
    if mode == "constant":
        lo = -d if d else 0
        begin, end = (int(b.rng.integers(lo, 4)) for _ in range(2))
        return (begin, end) if d + begin + end >= 0 else (0, 0)
    if d == 0:
        return 0, 0  # onnxruntime refuses to reflect/edge/wrap-pad a zero-size dim
    hi = {"reflect": d - 1, "edge": 3, "wrap": d}[mode]
    return int(b.rng.integers(0, hi + 1)), int(b.rng.integers(0, hi + 1))


def emit_pad(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1)
    modes = ["constant", "reflect", "edge"]
    if b.opset >= 19 and 0 not in a.shape:  # onnxruntime's wrap fails on empty inputs
        modes.append("wrap")
    mode = str(b.rng.choice(modes))
    rank = len(a.shape)
    axes = list(range(rank))
    if b.opset >= 18 and b.rng.random() < 0.4:
        axes = sorted(int(x) for x in b.rng.choice(rank, size=int(b.rng.integers(1, rank + 1)),
                                                   replace=False))
    amounts = [_pad_amounts(b, mode, a.shape[i]) for i in axes]
    pads = [p[0] for p in amounts] + [p[1] for p in amounts]
    ins = [a.name, b.const(np.array(pads, I64))]
    if mode == "constant" and b.rng.random() < 0.6:
        fill = float(b.rng.choice([0.0, 1.5, -2.0, np.inf, np.nan]
                                  if b.profile.regime == "special" else [0.0, 1.5, -2.0]))
        ins.append(b.const(np.array(fill, a.dtype)))
    if len(axes) != rank or (b.opset >= 18 and b.rng.random() < 0.2):
        ins += [""] * (3 - len(ins)) + [b.const(np.array(axes, I64))]
    shape = list(a.shape)
    for i, (lo, hi) in zip(axes, amounts):
        shape[i] += lo + hi
    b.node("Pad", ins, [(a.dtype, tuple(shape))], mode=mode)


def _split_sizes(b: Builder, d: int, n: int) -> list[int]:
    cuts = sorted(int(x) for x in b.rng.integers(0, d + 1, size=n - 1))
    return [hi - lo for lo, hi in zip([0] + cuts, cuts + [d])]


def emit_split(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1)
    axis = int(b.rng.integers(-len(a.shape), len(a.shape)))
    d = a.shape[axis]
    n = int(b.rng.integers(2, 4))
    r = b.rng.random()
    attrs: dict = {"axis": axis}
    ins = [a.name]
    if r < 0.5:
        sizes = _split_sizes(b, d, n)
        ins.append(b.const(np.array(sizes, I64)))
    elif b.opset >= 18 and d >= n:
        chunk = -(-d // n)  # the last chunk is smaller
        sizes = [chunk] * (d // chunk) + ([d % chunk] if d % chunk else [])
        attrs["num_outputs"] = n = len(sizes)
        if n < 2:
            return
    elif b.opset < 18 and d % n == 0:
        sizes = [d // n] * n
    else:
        return
    ax = axis % len(a.shape)
    outs = [(a.dtype, a.shape[:ax] + (s,) + a.shape[ax + 1:]) for s in sizes]
    b.node("Split", ins, outs, **attrs)


def emit_tile(b: Builder) -> None:
    a = b.pick(lambda v: 1 <= len(v.shape) <= 3)
    reps = [b.dim(1, 4) if b.rng.random() < 0.5 else 1 for _ in a.shape]
    shape = tuple(d * r for d, r in zip(a.shape, reps))
    b.node("Tile", [a.name, b.const(np.array(reps, I64))], [(a.dtype, shape)])


def emit_trilu(b: Builder) -> None:
    if not b.has("Trilu"):
        return
    dtype = b.fdt if b.rng.random() < 0.8 else I64
    a = b.pick(lambda v: len(v.shape) >= 2, dtype)
    ins = [a.name]
    if b.rng.random() < 0.6:
        ins.append(b.const(np.array(int(b.rng.integers(-3, 4)), I64)))
    b.node("Trilu", ins, [(dtype, a.shape)], upper=int(b.rng.random() < 0.5))


def emit_range(b: Builder) -> None:
    dtype = I64 if b.rng.random() < 0.6 else F32
    if dtype == F32:
        start = float(b.rng.choice([0.0, -1.5, 2.0]))
        delta = float(b.rng.choice([0.5, -0.25, 1.5, 2.0]))
    else:
        start, delta = int(b.rng.integers(-5, 6)), int(b.rng.choice([1, 2, -1, -3]))
    n = b.dim(1, 7)
    limit = start + n * delta - (delta / 2 if dtype == F32 and b.rng.random() < 0.5 else 0)
    inexact = dtype == F32 and b.rng.random() < 0.1
    if inexact:  # a count that depends on float rounding: an output, nothing else
        start, limit, delta = 0.0, float(b.rng.choice([1.0, 0.9, 3.0])), 0.1
    exact = (Fraction(limit) - Fraction(start)) / Fraction(delta)
    count = max(math.ceil(np.float32(limit - start) / np.float32(delta)) if inexact
                else math.ceil(exact), 0)
    runtime = dtype == I64 and b.rng.random() < 0.3
    args = []
    for x in (start, limit, delta):
        arr = np.array(x, dtype)
        args.append(b.new_input((), dtype, arr).name if runtime else b.const(arr))
    (out,) = b.node("Range", args, [(dtype, (count,))])
    if runtime:
        for name in args:
            b.vals[name].dynamic = True
    if inexact:
        out.dynamic = True
    elif dtype == F32 and b.fdt != F32:
        b.node("Cast", [out.name], [(b.fdt, out.shape)], to=ELEM[b.fdt])


# ---- export patterns --------------------------------------------------------------------

def emit_embedding(b: Builder) -> None:
    vocab, width = int(b.rng.integers(1, 9)), b.dim(1, 6)
    table = b.weight((vocab, width))
    seq = b.dim(1, 5)
    ids = b.rng.integers(-vocab if b.rng.random() < 0.2 else 0, vocab, size=(b.batch, seq))
    idx = _index_operand(b, ids, vocab)
    (emb,) = b.node("Gather", [table.name, idx.name], [(b.fdt, (b.batch, seq, width))])
    if b.rng.random() < 0.5:  # + position embeddings, Range -> Gather
        pos_table = b.weight((seq + int(b.rng.integers(0, 3)), width))
        args = [b.const(np.array(x, I64)) for x in (0, seq, 1)]
        (pos,) = b.node("Range", args, [(I64, (seq,))])
        (pe,) = b.node("Gather", [pos_table.name, pos.name], [(b.fdt, (seq, width))])
        b.node("Add", [emb.name, pe.name], [(b.fdt, emb.shape)])


def emit_group_norm(b: Builder) -> None:
    if not b.has("GroupNormalization"):
        return
    groups = int(b.rng.integers(1, 4))
    channels = groups * int(b.rng.integers(1, 3))
    # Not on zero-size tensors: onnxruntime's GroupNormalization fails there.
    spatial = tuple(int(b.rng.integers(1, 5)) for _ in range(int(b.rng.integers(1, 3))))
    x = b.new_input((b.batch, channels) + spatial)
    scale, bias = b.weight((channels,), 0.5), b.weight((channels,), 0.5)
    b.node("GroupNormalization", [x.name, scale.name, bias.name], [(b.fdt, x.shape)],
           num_groups=groups, epsilon=float(b.rng.choice([1e-2, 0.1])))


def emit_where_chain(b: Builder) -> None:
    dtype = b.fdt if b.rng.random() < 0.8 else I64
    x = b.pick(lambda v: True, dtype)
    for _ in range(int(b.rng.integers(1, 4))):
        if b.rng.random() < 0.5:
            cond = b.new_input(x.shape[int(b.rng.integers(0, len(x.shape) + 1)):], BOOL)
        else:
            c = b.partner(x)
            (cond,) = b.node("Less", [x.name, c.name], [(BOOL, bshape(x.shape, c.shape))])
        y = b.partner(x)
        args = [cond.name, x.name, y.name] if b.rng.random() < 0.5 else \
            [cond.name, y.name, x.name]
        (x,) = b.node("Where", args, [(dtype, bshape(cond.shape, x.shape, y.shape))])


def emit_masked_softmax(b: Builder) -> None:
    scores = b.pick(lambda v: len(v.shape) >= 2)
    t = scores.shape[-1]
    mask_shape = (1,) * (len(scores.shape) - 1) + (t,) if b.rng.random() < 0.5 \
        else scores.shape[-2:]
    mask = b.new_input(mask_shape, BOOL, b.rng.random(mask_shape) < 0.7)
    if b.rng.random() < 0.6:
        low = -np.inf if b.rng.random() < 0.4 else (-65504.0 if b.fdt == F16 else -1e9)
        (masked,) = b.node("Where", [mask.name, scores.name, b.const(np.array(low, b.fdt))],
                           [(b.fdt, scores.shape)])
    else:  # additive: (1 - mask) * -10000
        (m,) = b.node("Cast", [mask.name], [(b.fdt, mask_shape)], to=ELEM[b.fdt])
        (inv,) = b.node("Sub", [b.const(np.array(1, b.fdt)), m.name], [(b.fdt, mask_shape)])
        (bias,) = b.node("Mul", [inv.name, b.const(np.array(-10000, b.fdt))],
                         [(b.fdt, mask_shape)])
        (masked,) = b.node("Add", [scores.name, bias.name], [(b.fdt, scores.shape)])
    b.node("Softmax", [masked.name], [(b.fdt, scores.shape)], axis=-1)


def _conv_kind(b: Builder, c: int) -> tuple[int, int, list[int], dict]:
    """(weight channels, output channels, kernel, attrs) of a random Conv over c channels."""
    r = b.rng.random()
    if r < 0.5:  # depthwise
        k = [int(b.rng.choice([1, 3, 5, 7])), int(b.rng.choice([1, 3, 5]))]
        if b.rng.random() < 0.2:
            return 1, c, k, {"group": c, "auto_pad": "SAME_UPPER"}
        pads = [int(b.rng.integers(0, k[0])), int(b.rng.integers(0, k[1])),
                int(b.rng.integers(0, k[0])), int(b.rng.integers(0, k[1]))]
        return 1, c, k, {"group": c, "pads": pads}
    m = int(b.rng.integers(1, 7))
    if r < 0.8:  # tiling: a patch embedding, a downsampling
        k = [int(b.rng.choice([1, 2, 4])), int(b.rng.choice([1, 2, 3]))]
        return c, m, k, {"strides": list(k)}
    k = [int(b.rng.choice([2, 3])), int(b.rng.choice([1, 3]))]
    return c, m, k, {"strides": [2, 1], "dilations": [1, int(b.rng.integers(1, 3))],
                     "pads": [1, 0, 1, 1]}


def emit_conv(b: Builder) -> None:
    if b.fdt != F32:  # onnxruntime's CPU Conv is float32 only here
        return
    c = int(b.rng.integers(1, 7))
    wc, m, k, attrs = _conv_kind(b, c)
    strides, dil = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    dims = []
    for i in range(2):  # input sizes the windows fit, a multiple of a tiling kernel
        span = dil[i] * (k[i] - 1) + 1
        dims.append(int(b.rng.integers(1, 4)) * k[i] if "strides" in attrs and
                    "pads" not in attrs else int(b.rng.integers(max(1, span), 12)))
    x = b.new_input((b.batch, c, *dims))
    w = b.new_input((m, wc, *k)) if b.rng.random() < 0.2 else b.weight((m, wc, *k), 0.4)
    args = [x.name, w.name] + ([b.weight((m,), 0.5).name] if b.rng.random() < 0.6 else [])
    out = []
    for i in range(2):
        if attrs.get("auto_pad") == "SAME_UPPER":
            out.append(dims[i])
            continue
        pads = attrs.get("pads", [0, 0, 0, 0])
        span = dil[i] * (k[i] - 1) + 1
        out.append((dims[i] + pads[i] + pads[i + 2] - span) // strides[i] + 1)
    if min(out) < 1:
        return
    (y,) = b.node("Conv", args, [(F32, (b.batch, m, *out))], kernel_shape=k, **attrs)
    if b.rng.random() < 0.4 and b.has("LayerNormalization"):
        shape = (b.batch, *out, m)
        (t,) = b.node("Transpose", [y.name], [(F32, shape)], perm=[0, 2, 3, 1])
        scale, bias = b.weight((m,), 0.5), b.weight((m,), 0.5)
        b.node("LayerNormalization", [t.name, scale.name, bias.name], [(F32, shape)], axis=-1)


EMITTERS = [
    (emit_gather, 0.8, "index"), (emit_gather_elements, 0.8, "index"), (emit_pad, 0.8, "index"),
    (emit_split, 0.6, "index"), (emit_tile, 0.5, "index"), (emit_trilu, 0.5, "index"),
    (emit_range, 0.4, "index"), (emit_embedding, 0.6, "export"),
    (emit_group_norm, 0.5, "export"), (emit_where_chain, 0.8, "export"),
    (emit_masked_softmax, 0.6, "export"), (emit_conv, 0.6, "export"),
]
