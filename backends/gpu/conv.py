"""Conv on the GPU -- im2col into a scratch buffer, then cuBLAS -- or in onnxruntime on the
host, whichever the device times faster at this call site.

    im2col   col[n, g, (c, kh, kw), (oh, ow)] = x[n, g*Cg + c, oh*sh - ph + kh*dh, ...]
             (0 outside the input), one rendered kernel that also pre-fills the output
             with the bias when there is one
    GEMM     y[n, g] = W[g] @ col[n, g]: one strided-batched cuBLAS call (gemm.py), beta 1
             after the bias pre-fill
    host     the Conv node alone in onnxruntime (its NCHWc kernels) on copies: device ->
             host, run, host -> device

1-D and 2-D Conv (3-D stays refused), any pads, auto_pad, strides, dilations and groups;
float32 and float16. `Choice` runs the candidates by turns for their first RUNS runs each,
timing every run (CUDA events around the device path, the wall clock around the host
path's copies and run: `timer`, which tests replace), then keeps the faster (the median)
and says why in `reason` (the executable's notes and `.kernels.txt`). Until it has chosen,
the plan is not captured as a CUDA graph; once the host path is chosen, never.
"""

from __future__ import annotations

import dataclasses
import hashlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from autoclust.backends.gpu import cstyle, gemm

from autoclust.errors import CompileError
from autoclust.kernel import ir as kir
from autoclust.ops.library import window_pads  # the semantics' own geometry

BLOCK = 256
RUNS = 3              # timed runs of each candidate before choosing
MAX_COL_BYTES = 1 << 30  # an im2col buffer beyond this stays in onnxruntime
# {"gpu": timer, "onnxruntime": timer} replacing the measured timers (tests inject timings)
TIMERS: dict | None = None
DTYPES = ("float32", "float16")


@dataclasses.dataclass(frozen=True)
class Spec:
    """A Conv call's geometry (1-D as 2-D with height 1)."""

    n: int
    c: int
    h: int
    w: int
    m: int
    groups: int
    kh: int
    kw: int
    oh: int
    ow: int
    stride: tuple[int, int]
    dilation: tuple[int, int]
    pad: tuple[int, int]          # begin (height, width)
    dtype: str
    bias: bool

    @property
    def k(self) -> int:
        """Rows of a group's col matrix: Cg * KH * KW."""
        return self.c // self.groups * self.kh * self.kw

    @property
    def p(self) -> int:
        return self.oh * self.ow

    @property
    def col_elements(self) -> int:
        return self.n * self.groups * self.k * self.p

    def gemm(self) -> gemm.GemmPlan:
        """y [N, G, Mg, P] = W [G, Mg, K] @ col [N, G, K, P]."""
        mg = self.m // self.groups
        return gemm.plan_matmul((self.groups, mg, self.k), (self.n, self.groups, self.k,
                                                            self.p))


def spec(t: kir.LibraryCall, buffers: dict[int, kir.Buffer]) -> Spec:
    """The geometry of a Conv call; CompileError for what this path does not run."""
    x, w, out = buffers[t.inputs[0]], buffers[t.inputs[1]], buffers[t.outputs[0]]
    a = dict(t.attrs)
    nsp = len(x.shape) - 2
    if nsp not in (1, 2) or x.dtype not in DTYPES:
        raise CompileError(f"Conv ({', '.join(t.nodes)}): {nsp}-D {x.dtype} has no GPU path")
    kernel = list(a.get("kernel_shape") or w.shape[2:])
    _, pb, _ = window_pads(list(x.shape[2:]), kernel, a, pool=False)
    strides = list(a.get("strides") or [1] * nsp)
    dil = list(a.get("dilations") or [1] * nsp)
    hw, ohw = list(x.shape[2:]), list(out.shape[2:])
    if nsp == 1:  # as 2-D with height 1 (and no padding along it)
        strides, dil, kernel, hw, ohw = ([1] + v for v in (strides, dil, kernel, hw, ohw))
        pb = [0] + pb
    bias = len(t.inputs) > 2 and t.inputs[2] is not None
    s = Spec(x.shape[0], x.shape[1], hw[0], hw[1], w.shape[0], int(a.get("group", 1)),
             kernel[0], kernel[1], ohw[0], ohw[1], tuple(strides), tuple(dil), tuple(pb),
             x.dtype, bias)
    if s.col_elements * cstyle.itemsize(s.dtype) > MAX_COL_BYTES:
        raise CompileError(f"Conv ({', '.join(t.nodes)}): its im2col buffer would take "
                           f"{s.col_elements * cstyle.itemsize(s.dtype) >> 20} MiB")
    return s


def symbol(s: Spec) -> str:
    return "im2col_" + hashlib.sha1(repr(s).encode()).hexdigest()[:16]


def render(s: Spec, target: str, name: str) -> str:
    """The im2col (and bias pre-fill) kernel for target "cuda" or "c": a grid-stride loop
    over the col buffer's elements, then over the output's."""
    t = cstyle.storage(s.dtype)
    params = [f"const {t}* __restrict__ x", f"{t}* __restrict__ col"]
    if s.bias:
        params += [f"const {t}* __restrict__ b", f"{t}* __restrict__ y"]
    cuda = target == "cuda"
    head = (f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}'
            f"({', '.join(params)}) {{") if cuda else \
        f"void {name}({', '.join(params + ['unsigned ac_grid', 'unsigned ac_block'])}) {{"
    first, step = ("(long long)blockIdx.x * blockDim.x + threadIdx.x",
                   "(long long)gridDim.x * blockDim.x") if cuda else ("ac_t", "ac_n")
    cg, khw = s.c // s.groups, s.kh * s.kw
    (sh, sw), (ph, pw), (dh, dw) = s.stride, s.pad, s.dilation
    x_at = f"x[((n * {s.c} + c) * {s.h} + ih) * {s.w} + iw]"
    lines = [head]
    if not cuda:  # the emulated threads, one after another
        lines.append("  const long long ac_n = (long long)ac_grid * ac_block;")
        lines.append("  for (long long ac_t = 0; ac_t < ac_n; ac_t++) {")
    lines += [
        f"  for (long long e = {first}; e < {s.col_elements}LL; e += {step}) {{",
        f"    const long long p = e % {s.p}, r = e / {s.p};",
        f"    const long long kk = r % {s.k}, ng = r / {s.k};   /* ng = n * G + g */",
        f"    const long long n = ng / {s.groups}, g = ng % {s.groups};",
        f"    const long long c = g * {cg} + kk / {khw};",
        f"    const long long kh = kk % {khw} / {s.kw}, kw = kk % {s.kw};",
        f"    const long long ih = p / {s.ow} * {sh} - {ph} + kh * {dh};",
        f"    const long long iw = p % {s.ow} * {sw} - {pw} + kw * {dw};",
        f"    const int inside = ih >= 0 && ih < {s.h} && iw >= 0 && iw < {s.w};",
        f"    col[e] = inside ? {x_at} : ({t})0;",
        "  }",
    ]
    if s.bias:  # the output starts as the bias; the GEMM accumulates onto it
        total = s.n * s.m * s.p
        lines.append(f"  for (long long e = {first}; e < {total}LL; e += {step})")
        lines.append(f"    y[e] = b[e / {s.p} % {s.m}];")
    if not cuda:
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def items(s: Spec) -> int:
    """Blocks of BLOCK threads that cover the col buffer once."""
    return max(1, -(-s.col_elements // BLOCK))


# ---- the choice -----------------------------------------------------------------------------

def wall_timer(fn: Callable[[], None], sync: Callable[[], None]) -> float:
    """Milliseconds of fn() and the synchronization after it (host path)."""
    t0 = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - t0) * 1e3


class Choice:
    """A step with candidate implementations, chosen by timing at its first runs."""

    def __init__(self, name: str, candidates: dict[str, Callable[[list, Any], None]],
                 timers: dict[str, Callable[[Callable[[], None]], float]]):
        self.name = name
        self.candidates = candidates
        self.timers = timers
        self.times: dict[str, list[float]] = {k: [] for k in candidates}
        self.chosen = ""
        self.reason = f"{name}: timing GPU and onnxruntime (undecided)"

    def __call__(self, arrays: list, scratch: Any) -> None:
        if self.chosen:
            self.candidates[self.chosen](arrays, scratch)
            return
        turn = sum(len(v) for v in self.times.values()) % len(self.candidates)
        which = list(self.candidates)[turn]
        ms = self.timers[which](lambda: self.candidates[which](arrays, scratch))
        self.times[which].append(ms)
        if all(len(v) >= RUNS for v in self.times.values()):
            med = {k: statistics.median(v) for k, v in self.times.items()}
            self.chosen = min(med, key=med.get)
            self.reason = f"{self.name}: {self.chosen} chosen by timing (median ms: " + \
                ", ".join(f"{k} {v:.3g}" for k, v in med.items()) + ")"


def host_runner(t: kir.LibraryCall, buffers: dict[int, kir.Buffer],
                constants: dict[int, Any], threads: int = 0) -> Callable[[list], list]:
    """The Conv node alone in onnxruntime (constant weights and bias as initializers):
    run(host inputs in t.inputs order) -> [host output]."""
    from autoclust import registry
    from autoclust.ir import Graph
    g = Graph(f"conv_{t.nodes[0] if t.nodes else 'host'}")
    g.opset = {"": 17}
    ins = []
    for i, bid in enumerate(t.inputs):
        if bid is None:
            ins.append(None)
            continue
        b = buffers[bid]
        name = f"in{i}"
        if bid in constants:
            ins.append(g.add_initializer(name, np.asarray(constants[bid], b.dtype)))
        else:
            ins.append(g.add_input(name, np.dtype(b.dtype), tuple(b.shape)))
    out = buffers[t.outputs[0]]
    node = g.make_node("Conv", ins, attrs=dict(t.attrs), name="conv")
    y = node.outputs[0]
    y.dtype, y.shape = np.dtype(out.dtype), tuple(out.shape)
    g.outputs = [y]
    model = registry.importer("onnx").export_model(g)
    seg = registry.fallback().Segment(model, registry.fallback().sub_session_options(
        None, threads), name=g.name)
    fed = [bid for bid in t.inputs if bid is not None and bid not in constants]

    def run(host: dict[int, np.ndarray]) -> list:
        return seg.run([host[b] for b in fed])

    run.fed = fed
    return run


def make_step(exe: Any, i: int, t: kir.LibraryCall, allow_tf32: bool,
              timers: dict | None = None) -> Choice:
    """The Conv call at thunk i of executable `exe` as a Choice between the device path
    (im2col into the stream's scratch, then cuBLAS) and onnxruntime on the host."""
    from autoclust.backends.gpu import blas, device, library
    cp = device.cupy()
    s = spec(t, exe.buffers)
    plan = s.gemm()
    entry = exe.rendered.calls[i]
    fn = exe.module.get_function(entry.symbol)
    grid, block = (entry.grid(exe.sm_count),), (BLOCK,)
    exe.workspace_bytes[i] = s.col_elements * cstyle.itemsize(s.dtype)
    x_id, w_id, y_id = t.inputs[0], t.inputs[1], t.outputs[0]
    b_id = t.inputs[2] if s.bias else None
    launch = library.gemm_launcher(plan, s.dtype, 1.0, 1.0 if s.bias else 0.0, allow_tf32,
                                   blas.get())

    def on_device(arrays: list, scratch: Any) -> None:
        col = scratch.workspaces[i].data.ptr
        args = [arrays[x_id].data.ptr, col]
        if s.bias:
            args += [arrays[b_id].data.ptr, arrays[y_id].data.ptr]
        fn(grid, block, args)
        launch(arrays[w_id].data.ptr, col, arrays[y_id].data.ptr)

    run = host_runner(t, exe.buffers, exe.program.constants)

    def on_host(arrays: list, scratch: Any) -> None:  # synchronizes (the copies)
        host = {b: device.to_host(arrays[b]) for b in run.fed}
        (y,) = run(host)
        device.copyto(arrays[y_id], device.to_device(np.ascontiguousarray(y)))

    def device_timer(fn: Callable[[], None]) -> float:
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(cp.cuda.get_elapsed_time(start, end))

    def host_timer(fn: Callable[[], None]) -> float:
        return wall_timer(fn, lambda: cp.cuda.get_current_stream().synchronize())

    name = f"Conv {', '.join(t.nodes)}"
    return Choice(name, {"gpu": on_device, "onnxruntime": on_host},
                  timers or TIMERS or {"gpu": device_timer, "onnxruntime": host_timer})
