"""Generated depthwise 2-D Conv: one input channel per group, stride 1 (ConvNeXt's 7x7,
MobileNet's and EfficientNet's 3x3 and 5x5).

onnxruntime runs such a Conv in its blocked NCHWc layout, with a reorder of the input in
front and of the output behind. Inside a model it runs them back to back on warm buffers;
called from a cluster as a segment or a library call, the same Conv ran 1.5x its isolated
time (ConvNeXt-tiny's 56x56x96 7x7: 232 us alone on 2 threads, 347-374 us between our
kernels: its reorder buffers and weights cold, measured), and the Conv kept
ConvNeXt's blocks apart, so each block paid a segment. Here it is code of ours, in the
cluster, on the NCHW planes as they are:

    for each plane p = (n, c) in [start, stop):            (threads split the planes)
      copy the plane into a zeroed scratch block on the stack, offset by the pads
          (sh = oh + kh - 1 rows of sw = V * ceil(ow / V) + kw - 1 floats: the pads
           and the last vector's overrun read zeros, and no load needs a bounds test)
      for each block of ROWS output rows, for each vector of V columns (V = 16, 8 for
      outputs up to 8 wide):
          acc[j] = bias[c]
          for each scratch row t the block reads, for each kernel column q:
              x = scratch[r0 + t, col + q ...]                  (one load ...)
              acc[j] += x * w[c, t - j, q] for each row j it feeds  (... up to ROWS FMAs)
          y[p, r0 + j, col ...] = acc[j]                    (masked at the right edge)

Sizes, pads and the kernel are constants of the code. Stride or dilation other than 1, a
channel multiplier other than 1, float64 and symbolic sizes stay library calls (and the
clustering leaves such Convs to onnxruntime, `eligible`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from autoclust.backends.cpu.loops import entry_alloca, for_range, intrinsic, kernel_entry, splat
from llvmlite import ir

from autoclust.ir import Node
from autoclust.kernel import ir as kir
from autoclust.ops.library import window_pads

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
F32 = ir.FloatType()
PTR = ir.PointerType()
LANES = 16          # one 512-bit vector of float32; 8 (256 bits) for outputs <= 8 wide
ROWS = 4            # output rows sharing each input vector load
MAX_TAPS = 81       # kernels up to 9x9 (the taps are unrolled in the code)
MAX_SCRATCH = 32768  # floats of the padded plane on the stack (128 KB)


@dataclasses.dataclass(frozen=True)
class DwSpec:
    """A depthwise Conv: input [n, c, h, w], kernel [c, 1, kh, kw], output [n, c, oh, ow],
    top and left pads pt, pl (the bottom and right ones follow from oh, ow)."""

    n: int
    c: int
    h: int
    w: int
    kh: int
    kw: int
    pt: int
    pl: int
    oh: int
    ow: int
    bias: bool

    @property
    def rows(self) -> int:
        """Units of work threads split: the planes."""
        return self.n * self.c

    @property
    def flops(self) -> float:
        return 2.0 * self.n * self.c * self.oh * self.ow * self.kh * self.kw

    @property
    def lanes(self) -> int:
        """Columns per vector: 8 for outputs up to 8 wide (ConvNeXt's last stage is 7x7:
        16 lanes computed 9 for nothing), else 16."""
        return 8 if self.ow <= 8 else LANES

    @property
    def vectors(self) -> int:
        return -(-self.ow // self.lanes)

    @property
    def sw(self) -> int:
        """Scratch row width: every vector of output columns reads kw - 1 beyond it."""
        return self.vectors * self.lanes + self.kw - 1

    @property
    def sh(self) -> int:
        return self.oh + self.kh - 1

    @property
    def scratch(self) -> int:
        """Floats of the padded plane."""
        return self.sh * self.sw


def _geometry(x_shape: tuple, w_shape: tuple, attrs: dict) -> tuple | None:
    """(kh, kw, pt, pl, oh, ow) of a depthwise, stride-1 Conv of these shapes, else None."""
    if len(x_shape) != 4 or len(w_shape) != 4:
        return None
    c = x_shape[1]
    if not all(isinstance(d, int) for d in (*x_shape, *w_shape)):
        return None
    if int(attrs.get("group", 1)) != c or tuple(w_shape[:2]) != (c, 1) or c < 1:
        return None
    kh, kw = w_shape[2], w_shape[3]
    if list(attrs.get("strides") or [1, 1]) != [1, 1] or \
            list(attrs.get("dilations") or [1, 1]) != [1, 1]:
        return None
    if not 1 <= kh * kw <= MAX_TAPS:
        return None
    out, begins, ends = window_pads(x_shape[2:], [kh, kw], attrs, pool=False)
    if min(begins + ends) < 0 or None in out or min(out) < 1:
        return None
    return kh, kw, begins[0], begins[1], out[0], out[1]


def eligible(node: Node) -> bool:
    """Whether `node` is a Conv this module generates (the clustering keeps it then)."""
    if node.op != "Conv" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return False
    x, w = node.inputs[0], node.inputs[1]
    if x is None or w is None or x.shape is None or w.shape is None:
        return False
    if np.dtype(x.dtype) != np.float32:
        return False
    geo = _geometry(tuple(x.shape), tuple(w.shape), node.attrs)
    if geo is None:
        return False
    kh, kw, pt, pl, oh, ow = geo
    n, c, h, w = x.shape
    return DwSpec(n, c, h, w, kh, kw, pt, pl, oh, ow, False).scratch <= MAX_SCRATCH


def spec_for(t: kir.LibraryCall, buffers: dict[int, kir.Buffer]) -> DwSpec | None:
    """The DwSpec of a Conv call this module generates, else None."""
    if t.op != "Conv" or len(t.outputs) != 1 or any(v is not None for v in t.views):
        return None
    ins = [None if b is None else buffers[b] for b in t.inputs]
    if len(ins) < 2 or ins[0] is None or ins[1] is None:
        return None
    x, w, y = ins[0], ins[1], buffers[t.outputs[0]]
    bias = ins[2] if len(ins) > 2 else None
    if any(b.dtype != "float32" for b in (x, w, y, *([bias] if bias is not None else []))):
        return None
    geo = _geometry(tuple(x.shape), tuple(w.shape), dict(t.attrs))
    if geo is None or 0 in x.shape:
        return None
    kh, kw, pt, pl, oh, ow = geo
    n, c, h, wd = x.shape
    if tuple(y.shape) != (n, c, oh, ow) or (bias is not None and tuple(bias.shape) != (c,)):
        return None
    spec = DwSpec(n, c, h, wd, kh, kw, pt, pl, oh, ow, bias is not None)
    return spec if spec.scratch <= MAX_SCRATCH else None


def code_key(spec: DwSpec) -> str:
    return "dwconv|" + repr(spec)


def emit(module: ir.Module, name: str, spec: DwSpec) -> None:
    """Emit `void name(ptr bufs, i64 start, i64 stop)` computing planes [start, stop);
    bufs holds x, w, (bias,) y."""
    names = ["x", "w"] + (["bias"] if spec.bias else []) + ["y"]
    b, ptr, fn = kernel_entry(module, name, names)
    _Emitter(b, spec, ptr).planes(fn.args[1], fn.args[2])
    b.ret_void()


class _Emitter:
    def __init__(self, b: ir.IRBuilder, spec: DwSpec, ptr: dict[str, ir.Value]):
        self.b, self.s, self.p = b, spec, ptr
        self.lanes = spec.lanes
        self.vty = ir.VectorType(F32, self.lanes)

    def _intrinsic(self, name: str, ret: ir.Type, args: list) -> ir.Value:
        return intrinsic(self.b, name, ret, args)

    def _splat(self, x: ir.Value) -> ir.Value:
        """x (a float or an i64) in every lane."""
        return splat(self.b, x, self.lanes)

    def _at(self, base: ir.Value, off: ir.Value) -> ir.Value:
        return self.b.gep(base, [off], inbounds=True, source_etype=F32)

    def planes(self, start: ir.Value, stop: ir.Value) -> None:
        s, b = self.s, self.b
        scratch = entry_alloca(b, F32, "scratch", count=s.sh * s.sw)
        self._intrinsic("llvm.memset.p0.i64", ir.VoidType(),
                        [scratch, I8(0), I64(4 * s.sh * s.sw), I1(0)])
        with for_range(b, start, stop, "plane") as p:
            c = b.urem(p, I64(s.c))
            x = self._at(self.p["x"], b.mul(p, I64(s.h * s.w)))
            y = self._at(self.p["y"], b.mul(p, I64(s.oh * s.ow)))
            w = self._at(self.p["w"], b.mul(c, I64(s.kh * s.kw)))
            with for_range(b, I64(0), I64(s.h), "row") as r:
                dst = self._at(scratch, b.add(b.mul(r, I64(s.sw)), I64(s.pt * s.sw + s.pl)))
                self._intrinsic("llvm.memcpy.p0.p0.i64", ir.VoidType(),
                                [dst, self._at(x, b.mul(r, I64(s.w))), I64(4 * s.w), I1(0)])
            bias = self._splat(b.load(self._at(self.p["bias"], c), typ=F32)) if s.bias \
                else ir.Constant(self.vty, [0.0] * self.lanes)
            weights = [b.load(self._at(w, I64(i)), typ=F32) for i in range(s.kh * s.kw)]
            taps = [self._splat(v) for v in weights]
            full = s.oh // ROWS * ROWS
            if full:
                with for_range(b, I64(0), I64(full // ROWS), "block") as blk:
                    self._columns(scratch, y, b.mul(blk, I64(ROWS)), ROWS, taps, bias)
            if full < s.oh:
                with for_range(b, I64(full), I64(s.oh), "tail") as r0:
                    self._columns(scratch, y, r0, 1, taps, bias)

    def _columns(self, scratch: ir.Value, y: ir.Value, r0: ir.Value, rows: int,
                 taps: list, bias: ir.Value) -> None:
        """Output rows r0 .. r0 + rows - 1, every vector of columns."""
        s, b = self.s, self.b
        with for_range(b, I64(0), I64(s.vectors), "vec") as v:
            col = b.mul(v, I64(self.lanes))
            acc = [bias] * rows
            for t in range(rows + s.kh - 1):
                base = b.add(b.mul(b.add(r0, I64(t)), I64(s.sw)), col)
                for q in range(s.kw):
                    xv = b.load(b.bitcast(self._at(scratch, b.add(base, I64(q))), PTR),
                                typ=self.vty, align=4)
                    for j in range(rows):
                        kh = t - j
                        if 0 <= kh < s.kh:
                            acc[j] = self._intrinsic(f"llvm.fma.v{self.lanes}f32", self.vty,
                                                     [xv, taps[kh * s.kw + q], acc[j]])
            lanes = ir.Constant(ir.VectorType(I64, self.lanes), list(range(self.lanes)))
            mask = b.icmp_signed("<", b.add(self._splat(col), lanes),
                                 self._splat(I64(s.ow)))
            for j in range(rows):
                row = b.add(r0, I64(j))
                dst = self._at(y, b.add(b.mul(row, I64(s.ow)), col))
                self._intrinsic(f"llvm.masked.store.v{self.lanes}f32.p0", ir.VoidType(),
                                [acc[j], dst, I32(4), mask])
