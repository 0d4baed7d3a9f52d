"""Library calls of the CPU backend: MatMul, Gemm, Conv, ConvTranspose, pooling, Einsum.

`make_call(op, attrs, in_types, out_types, threads, constants)` returns a LibraryFn that
writes an op's results into preallocated output arrays. Implementations:

- "mlas": a single-node onnxruntime session (mlas.py), weights prepacked.
- "numpy": OpenBLAS, im2col Conv, pooling passes, einsum (numpy_calls.py); "ref": the op's
  NumPy reference plus a copy (ConvTranspose, MaxPool Indices).
- "onednn": oneDNN's matmul for large float32 GEMMs, chosen by measurement (choice.py,
  onednn.py).

When both apply, the choice is a size rule, decided once per (op, attrs, types, threads)
per process: below the op's small-work threshold numpy wins on call overhead; above it mlas
is taken. (An earlier version probed both on random inputs at compile time: it cost ~1 s of
compile time for BERT and its answers were noise on a shared machine: one probe timed
OpenBLAS at 371 ms for a 0.5 ms MatMul; picking numpy for a mid-size GEMM was a 10-100x
loss whenever other processes ran.)

Measured on the 2-core znver4 build machine (noisy: other jobs share it), 2 threads:
- per-call overhead: numpy matmul 1.0 us; onnxruntime io_binding run 3-5 us, plus 3 us
  when inputs are rebound; plain sess.run 6.9 us plus an output copy; run_with_ort_values
  ~45 us.
- MatMul float32, numpy vs mlas(bound): [32,64]x[64,64] 2.7 vs 8.5 us; [64,64]x[64,64]
  4.3-6 vs 8-11 us; [128,128]^2 36 vs 30-34 us quiet, 11900 vs 61 us loaded;
  [256,256]x[256,1024] 0.80-1.1 ms vs 0.86-1.2 ms (both ~150 GFLOP/s on a quiet machine);
  [512,256]x[256,688] 12.3 ms vs 1.24 ms loaded; MLAS with a constant B (prepacked) is
  7-12% faster than with B as an input.
- OpenBLAS goes multi-threaded above m*n*k = 262144 (5.2e5 flops), and its busy-waiting
  threads collapse under load (48 ms instead of 1.2 ms for [256,256]x[256,1024]); mlas
  (spinning off) stays at 1.3-1.7 ms. So numpy only takes what OpenBLAS runs on one thread.
- batched [16,12,128,64]x[16,12,64,128]: stacked np.matmul 520-650 ms (no BLAS),
  per-matrix loop 22 ms, mlas 12-16 ms.
- pooling through numpy makes one strided pass per kernel offset: MaxPool 2x2 on
  [8,16,64,64] took 0.62 ms; pools go to mlas above POOL_SMALL_WORK window reads.
- the numpy side uses OpenBLAS's own thread count (process-global), not `threads`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from autoclust.backends.cpu import choice as gemm_choice
from autoclust.backends.cpu import mlas, numpy_calls
from autoclust.backends.cpu.call_types import F32, F64, Arrays, RunFn, TypeShape, describe, freeze
from autoclust.backends.cpu.mlas import CONTRIB, wait_background

__all__ = ["OPS", "LibraryFn", "decisions", "make_call", "make_call_for", "supported",
           "wait_background"]

from autoclust import ops
from autoclust.errors import UnsupportedOpError
from autoclust.kernel import ir as kir
from autoclust.ops import custom

OPS = frozenset(d.op for d in ops.all_ops() if d.kind == ops.LIBRARY)
# dtypes onnxruntime's CPU kernels take (float16 excluded: we compute it in float32).
MLAS_TYPES = {"MatMul": (F32, F64), "Gemm": (F32, F64), "Einsum": (F32, F64),
              "FusedMatMul": (F32,),
              "MaxPool": (F32, F64), "Conv": (F32,), "ConvTranspose": (F32,),
              "AveragePool": (F32,), "GlobalAveragePool": (F32,), "GlobalMaxPool": (F32,)}
SMALL_FLOPS = 5.3e5        # below: numpy (one OpenBLAS thread: m*n*k < 262144)
POOL_SMALL_WORK = 2e4      # pools: window reads below which numpy's passes are cheaper

_DECISIONS: dict[tuple, tuple[str, str]] = {}


class LibraryFn:
    """One library op bound to concrete types: call(inputs, outputs) fills outputs."""

    def __init__(self, op: str, impl: str, run: RunFn, note: str = ""):
        self.op = op
        self.impl = impl
        self.note = note
        self._run = run
        self.strided = impl == "onednn"  # writes strided outputs in place

    def __call__(self, inputs: Arrays, outputs: Sequence[np.ndarray]) -> None:
        if self.strided or all(y.flags.c_contiguous for y in outputs):
            self._run(inputs, outputs)
            return
        # The implementations write C-order memory (onnxruntime binds raw buffers, the NumPy
        # ones reshape): strided outputs get a contiguous stand-in, copied back once.
        dense = [y if y.flags.c_contiguous else np.empty(y.shape, y.dtype) for y in outputs]
        self._run(inputs, dense)
        for y, d in zip(outputs, dense):
            if d is not y:
                np.copyto(y, d)

    def __repr__(self) -> str:
        return f"LibraryFn({self.op}, impl={self.impl}{', ' + self.note if self.note else ''})"


# ---- public API -----------------------------------------------------------------------------

def supported(op: str, attrs: dict[str, Any]) -> str | None:
    """None when make_call implements op with these attributes, else the reason why not
    (dtypes are the op table's business: OpDef.dtypes)."""
    if op not in OPS:
        if custom.for_call(op) is not None:
            return None  # a custom call: its kernel, bound by make_call_for
        return f"{op} is not a library call of the CPU backend"
    if op in ("Conv", "ConvTranspose", "MaxPool", "AveragePool") and \
            attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID", "SAME_UPPER",
                                                    "SAME_LOWER"):
        return f"{op} auto_pad={attrs.get('auto_pad')!r} is unknown"
    return None


def make_call(op: str, attrs: dict[str, Any], in_types: Sequence[TypeShape | None],
              out_types: Sequence[TypeShape], threads: int = 0,
              constants: dict[int, np.ndarray] | None = None,
              impl: str | None = None, layouts: tuple = ()) -> LibraryFn:
    """Build the fastest LibraryFn for op on these types; impl forces "mlas", "numpy" or
    "onednn". layouts: element strides per operand (inputs, then outputs; None or absent:
    C-contiguous) of the strided arrays the call will be given."""
    why = supported(op, attrs)
    if why is not None:
        raise UnsupportedOpError(why)
    in_types = [None if t is None else (np.dtype(t[0]), tuple(t[1])) for t in in_types]
    out_types = [(np.dtype(t[0]), tuple(t[1])) for t in out_types]
    constants = dict(constants or {})
    if op == "Gemm" and len(in_types[0][1]) > 2:
        return _flattened_gemm(attrs, in_types, out_types, threads, constants, impl)
    builders = _candidates(op, attrs, in_types, out_types, threads, constants)
    dnnl = gemm_choice.onednn_builder(op, attrs, in_types, out_types, threads, constants, layouts)
    if dnnl is not None:
        builders["onednn"] = dnnl
    if impl is not None:
        if impl not in builders:
            raise UnsupportedOpError(f"{op} on {describe(in_types)}: implementation {impl!r} "
                                     f"is not available (have {sorted(builders)})")
        if impl == "mlas":  # forced: onnxruntime's refusal is the caller's error
            builders["mlas"] = mlas.forced(op, attrs, in_types, out_types, threads, constants)
        return LibraryFn(op, impl, builders[impl](), "forced")
    key = (op, freeze(attrs), tuple(in_types), tuple(out_types), threads,
           tuple(sorted(constants)), tuple(layouts))
    if key not in _DECISIONS:
        _DECISIONS[key] = _decide(op, attrs, in_types, out_types, builders)
        if _DECISIONS[key][1].startswith("large") and op in gemm_choice.GEMM_OPS:
            packed = builders.get("mlas")
            if packed is not None and 1 in constants:  # MLAS timed with prepacked weights,
                # built only when measured: without oneDNN, prepacking stays in the background
                def packed() -> RunFn:
                    return mlas.forced(op, attrs, in_types, out_types, threads, constants)()
            _DECISIONS[key] = gemm_choice.decide(key, builders, packed, in_types, out_types,
                                                 layouts, constants)
    choice, note = _DECISIONS[key]
    return _build(op, choice, builders, note)


def _flattened_gemm(attrs: dict[str, Any], in_types: list, out_types: list, threads: int,
                    constants: dict[int, np.ndarray], impl: str | None) -> LibraryFn:
    """Gemm whose A is [..., K] (a MatMul with its bias Add folded in): batch dims join M."""
    if attrs.get("transA", 0):
        raise UnsupportedOpError(f"Gemm with transA on a {len(in_types[0][1])}-D A")
    (da, sa), (dy, sy) = in_types[0], out_types[0]
    flat_in = [(da, (math.prod(sa[:-1]), sa[-1]))] + list(in_types[1:])
    fn = make_call("Gemm", attrs, flat_in, [(dy, (math.prod(sy[:-1]), sy[-1]))], threads,
                   constants, impl)
    views = _ViewCache()

    def run(inputs: Arrays, outputs: Sequence[np.ndarray]) -> None:
        fn([views.flat(inputs[0], 0), *inputs[1:]], [views.flat(outputs[0], 1)])

    return LibraryFn("Gemm", fn.impl, run, f"{fn.note}, A flattened to {flat_in[0][1]}")


class _ViewCache:
    """2-D views of the arrays passed last time: the same array yields the same view object,
    so the onnxruntime binding (keyed on identity) is not rebuilt every call."""

    def __init__(self):
        self._last: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def flat(self, x: np.ndarray, slot: int) -> np.ndarray:
        hit = self._last.get(slot)
        if hit is not None and hit[0] is x:
            return hit[1]
        view = x.reshape(-1, x.shape[-1])
        self._last[slot] = (x, view)
        return view


def make_call_for(thunk: kir.LibraryCall, buffers: Sequence[kir.Buffer], threads: int = 0,
                  constants: dict[int, np.ndarray] | None = None) -> LibraryFn:
    """make_call for a kernel-IR LibraryCall; constants maps buffer id -> value."""
    by_id = {b.id: b for b in buffers}
    n_in = len(thunk.inputs)

    def typ(k: int, b: int) -> TypeShape:  # a view's logical shape, else the buffer's
        view = thunk.view(k)
        return np.dtype(by_id[b].dtype), view.shape if view is not None else by_id[b].shape

    in_types = [None if b is None else typ(k, b) for k, b in enumerate(thunk.inputs)]
    out_types = [typ(n_in + j, b) for j, b in enumerate(thunk.outputs)]
    op = custom.for_call(thunk.op)
    if op is not None:
        return _custom_call(op, thunk)
    consts = {i: constants[b] for i, b in enumerate(thunk.inputs)
              if b is not None and constants and b in constants}
    layouts = tuple(None if v is None else v.strides for v in thunk.views)
    fn = make_call(thunk.op, dict(thunk.attrs), in_types, out_types, threads, consts,
                   layouts=layouts)
    return gemm_choice.in_place(fn, thunk.views, n_in) if thunk.views else fn


def _custom_call(op: custom.CustomOp, thunk: kir.LibraryCall) -> LibraryFn:
    """A custom op's kernel (autoclust.ops.custom) writing into the cluster's buffers: a C
    kernel gets their pointers, a NumPy kernel's results are checked and copied in."""
    node = thunk.nodes[0] if thunk.nodes else ""
    attrs = dict(thunk.attrs)
    if op.c_kernel is not None:
        return LibraryFn(thunk.op, "custom-c", custom.CCall(op, node), op.name)

    def run(inputs: Arrays, outputs: Sequence[np.ndarray]) -> None:
        custom.call_into(op, [None if x is None else ops.dense(x) for x in inputs], outputs,
                         attrs, node)

    return LibraryFn(thunk.op, "custom-numpy", run, op.name)


def decisions() -> dict[tuple, tuple[str, str]]:
    """The cached (impl, note) choices of this process, keyed by call signature."""
    return dict(_DECISIONS)


# ---- choosing --------------------------------------------------------------------------------

def _candidates(op: str, attrs: dict[str, Any], in_types: list, out_types: list,
                threads: int, constants: dict[int, np.ndarray]) -> dict[str, Callable]:
    """impl name -> zero-argument builder of its run function."""
    dtype = next(t[0] for t in in_types if t is not None)
    found: dict[str, Callable] = {}
    numpy_builder = numpy_calls.BUILDERS.get(op)
    if op == "MaxPool" and len(out_types) > 1:
        numpy_builder = None  # Indices: only the reference computes them
    if numpy_builder is not None:
        found["numpy"] = lambda: numpy_calls.staged(numpy_builder(attrs, in_types, out_types),
                                         in_types, out_types)
    else:
        found["ref"] = lambda: numpy_calls.ref_run(op, attrs)
    if dtype in MLAS_TYPES.get(op, ()):  # built only when chosen (see _build)
        found["mlas"] = lambda: mlas.runner(op, attrs, in_types, out_types, threads,
                                             constants)
    return found


def _build(op: str, choice: str, builders: dict[str, Callable], note: str) -> LibraryFn:
    """The chosen implementation; onnxruntime refusing a case means the other one."""
    try:
        return LibraryFn(op, choice, builders[choice](), note)
    except Exception as exc:
        if choice != "mlas":
            raise
        other = "numpy" if "numpy" in builders else "ref"
        return LibraryFn(op, other, builders[other](), f"mlas refused: {exc}"[:120])



def _decide(op: str, attrs: dict[str, Any], in_types: list, out_types: list,
            builders: dict[str, Callable]) -> tuple[str, str]:
    if len(builders) == 1:
        return next(iter(builders)), "only implementation"
    fallback = "numpy" if "numpy" in builders else "ref"
    opdef = ops.get(op, "com.microsoft" if op in CONTRIB else "")
    work = opdef.flops(attrs, in_types, out_types)
    small = POOL_SMALL_WORK if "Pool" in op else SMALL_FLOPS
    if work < small or any(math.prod(t[1]) == 0 for t in out_types):
        return fallback, f"small ({work:.2g} flops)"
    return "mlas", f"large ({work:.2g} flops)"
