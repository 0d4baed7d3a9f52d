"""Library calls of the CPU backend: MatMul, Gemm, Conv, ConvTranspose, pooling, Einsum.

`make_call(op, attrs, in_types, out_types, threads, constants)` returns a LibraryFn that
writes an op's results into preallocated output arrays. Two implementations:

- "mlas": a single-node onnxruntime session (ORT_ENABLE_ALL, spinning off, compile-time
  constants as initializers so MLAS prepacks weights), run through an io_binding whose
  outputs are OrtValues over our arrays. The binding is rebuilt only when a caller passes
  different array objects than last time (binding memory is shared, not copied).
- "numpy": OpenBLAS matmul with out= (batched MatMul as one 2-D call or a loop of 2-D calls:
  NumPy 2.4's stacked matmul does not use BLAS), im2col + matmul Conv, pooling as a loop
  over kernel offsets on a preallocated padded buffer, einsum with a precomputed path.
  float16 computes in float32 and rounds once, as the op references do.
  ("ref": the op's NumPy reference plus a copy, for ConvTranspose and MaxPool Indices.)

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

import collections
import concurrent.futures
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from autoclust.backends import ort as ort_backend
from autoclust.backends.cpu import choice as gemm_choice
from onnx import helper

from autoclust import ops
from autoclust.errors import UnsupportedOpError
from autoclust.kernel import ir as kir
from autoclust.ops import custom
from autoclust.ops.library import window_pads  # the semantics' own geometry

TypeShape = tuple[np.dtype, tuple[int, ...]]
Arrays = Sequence[np.ndarray | None]
RunFn = Callable[[Arrays, Sequence[np.ndarray]], None]

F16, F32, F64 = np.dtype("float16"), np.dtype("float32"), np.dtype("float64")
INTS = tuple(np.dtype(t) for t in ("int32", "int64"))
OPS = frozenset(d.op for d in ops.all_ops() if d.kind == ops.LIBRARY)
# dtypes onnxruntime's CPU kernels take (float16 excluded: we compute it in float32).
MLAS_TYPES = {"MatMul": (F32, F64), "Gemm": (F32, F64), "Einsum": (F32, F64),
              "FusedMatMul": (F32,),
              "MaxPool": (F32, F64), "Conv": (F32,), "ConvTranspose": (F32,),
              "AveragePool": (F32,), "GlobalAveragePool": (F32,), "GlobalMaxPool": (F32,)}
SMALL_FLOPS = 5.3e5        # below: numpy (one OpenBLAS thread: m*n*k < 262144)
POOL_SMALL_WORK = 2e4      # pools: window reads below which numpy's passes are cheaper
OPSET = 18
CONTRIB = ("FusedMatMul",)  # ops of onnxruntime's com.microsoft domain

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
              impl: str | None = None, layouts: tuple = (),
              prefer: str | None = None) -> LibraryFn:
    """Build the fastest LibraryFn for op on these types; impl forces "mlas", "numpy" or
    "onednn". layouts: element strides per operand (inputs, then outputs; None or absent:
    C-contiguous) of the strided arrays the call will be given. `prefer`: the large-GEMM
    implementation measured for another shape of the same call (a new sequence length of
    a cluster with symbolic dims), taken instead of measuring again."""
    why = supported(op, attrs)
    if why is not None:
        raise UnsupportedOpError(why)
    in_types = [None if t is None else (np.dtype(t[0]), tuple(t[1])) for t in in_types]
    out_types = [(np.dtype(t[0]), tuple(t[1])) for t in out_types]
    constants = dict(constants or {})
    if op == "Gemm" and len(in_types[0][1]) > 2:
        return _flattened_gemm(attrs, in_types, out_types, threads, constants, impl, prefer)
    builders = _candidates(op, attrs, in_types, out_types, threads, constants)
    dnnl = gemm_choice.onednn_builder(op, attrs, in_types, out_types, threads, constants, layouts)
    if dnnl is not None:
        builders["onednn"] = dnnl
    if impl is not None:
        if impl not in builders:
            raise UnsupportedOpError(f"{op} on {_describe(in_types)}: implementation {impl!r} "
                                     f"is not available (have {sorted(builders)})")
        if impl == "mlas":  # forced: onnxruntime's refusal is the caller's error
            builders["mlas"] = _forced_mlas(op, attrs, in_types, out_types, threads, constants)
        return LibraryFn(op, impl, builders[impl](), "forced")
    key = (op, _freeze(attrs), tuple(in_types), tuple(out_types), threads,
           tuple(sorted(constants)), tuple(layouts))
    if key not in _DECISIONS:
        _DECISIONS[key] = _decide(op, attrs, in_types, out_types, builders)
        if _DECISIONS[key][1].startswith("large") and op in gemm_choice.GEMM_OPS:
            mlas = builders.get("mlas")
            if prefer in ("mlas", "onednn") and prefer in builders:
                _DECISIONS[key] = (prefer, "large, as measured for another shape")
            else:
                if mlas is not None and 1 in constants:  # MLAS timed with prepacked weights
                    mlas = _forced_mlas(op, attrs, in_types, out_types, threads, constants)
                _DECISIONS[key] = gemm_choice.decide(key, builders, mlas, in_types,
                                                     out_types, layouts, constants)
    choice, note = _DECISIONS[key]
    return _build(op, choice, builders, note)


def _flattened_gemm(attrs: dict[str, Any], in_types: list, out_types: list, threads: int,
                    constants: dict[int, np.ndarray], impl: str | None,
                    prefer: str | None = None) -> LibraryFn:
    """Gemm whose A is [..., K] (a MatMul with its bias Add folded in): batch dims join M."""
    if attrs.get("transA", 0):
        raise UnsupportedOpError(f"Gemm with transA on a {len(in_types[0][1])}-D A")
    (da, sa), (dy, sy) = in_types[0], out_types[0]
    flat_in = [(da, (math.prod(sa[:-1]), sa[-1]))] + list(in_types[1:])
    fn = make_call("Gemm", attrs, flat_in, [(dy, (math.prod(sy[:-1]), sy[-1]))], threads,
                   constants, impl, prefer=prefer)
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
                  constants: dict[int, np.ndarray] | None = None,
                  impl: str | None = None) -> LibraryFn:
    """make_call for a kernel-IR LibraryCall; constants maps buffer id -> value. `impl`
    (optional): the implementation an earlier binding of the same call chose (see
    make_call's `prefer`)."""
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
                   layouts=layouts, prefer=impl)
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
    numpy_builder = NUMPY_BUILDERS.get(op)
    if op == "MaxPool" and len(out_types) > 1:
        numpy_builder = None  # Indices: only the reference computes them
    if numpy_builder is not None:
        found["numpy"] = lambda: _staged(numpy_builder(attrs, in_types, out_types),
                                         in_types, out_types)
    else:
        found["ref"] = lambda: _ref_run(op, attrs)
    if dtype in MLAS_TYPES.get(op, ()):  # built only when chosen (see _build)
        found["mlas"] = lambda: _mlas_runner(op, attrs, in_types, out_types, threads,
                                             constants)
    return found


def _forced_mlas(op: str, attrs: dict[str, Any], in_types: list, out_types: list,
                 threads: int, constants: dict[int, np.ndarray]) -> Callable:
    try:
        sess = _session(op, attrs, in_types, out_types, threads, constants)
    except Exception as exc:  # noqa: BLE001 - turned into our error below
        raise UnsupportedOpError(f"{op} on {_describe(in_types)}: implementation 'mlas' is "
                                 f"not available: onnxruntime refused it ({exc})") from None
    return lambda: _bound_runner(sess, in_types, out_types, constants)


def _build(op: str, choice: str, builders: dict[str, Callable], note: str) -> LibraryFn:
    """The chosen implementation; onnxruntime refusing a case means the other one."""
    try:
        return LibraryFn(op, choice, builders[choice](), note)
    except Exception as exc:
        if choice != "mlas":
            raise
        other = "numpy" if "numpy" in builders else "ref"
        return LibraryFn(op, other, builders[other](), f"mlas refused: {exc}"[:120])


# Single-node sessions, reused by every call of the same op, attributes, dtypes and ranks
# on the same constant arrays: their dims are symbolic, so a new sequence length or batch
# size reuses them (and their prepacked weights) instead of building 96 sessions again for
# BERT-base. Bounded: the least recently used session goes (and frees its weights).
# Values are (future of the session, its constants).
_SESSIONS: collections.OrderedDict = collections.OrderedDict()
_SESSIONS_LOCK = threading.Lock()
MAX_SESSIONS = 256
# Build weight-prepacking sessions in one background thread (see _mlas_runner); tests
# turn it off to check the synchronous path.
BACKGROUND_PREPACK = True
_BACKGROUND: dict[str, concurrent.futures.ThreadPoolExecutor] = {}


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


# ---- onnxruntime (MLAS) ---------------------------------------------------------------------

def _session(op: str, attrs: dict[str, Any], in_types: list, out_types: list, threads: int,
             constants: dict[int, np.ndarray]) -> ort.InferenceSession:
    """The single-node onnxruntime session for op (cached in _SESSIONS), built now."""
    return _session_future(op, attrs, in_types, out_types, threads, constants, False).result()


def _session_future(op: str, attrs: dict[str, Any], in_types: list, out_types: list,
                    threads: int, constants: dict[int, np.ndarray],
                    background: bool) -> concurrent.futures.Future:
    """A future of the session for op (cached in _SESSIONS): built in the background
    thread when `background`, else now (raising what onnxruntime raises)."""
    key = (op, _freeze(attrs), tuple(None if t is None else (t[0], len(t[1]), i in constants
                                                             and t[1]) for i, t in
                                     enumerate(in_types)),
           tuple((t[0], len(t[1])) for t in out_types), threads,
           tuple((i, id(c)) for i, c in sorted(constants.items())))
    with _SESSIONS_LOCK:
        hit = _SESSIONS.get(key)
        if hit is not None and all(hit[1][i] is c for i, c in constants.items()):
            _SESSIONS.move_to_end(key)
            return hit[0]
    args = (op, attrs, in_types, out_types, threads, constants)
    if background:
        with _SESSIONS_LOCK:
            if _BACKGROUND.get("pool") is None:
                _BACKGROUND["pool"] = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="autoclust-prepack")
            future = _BACKGROUND["pool"].submit(_new_session, *args)
    else:
        future = concurrent.futures.Future()
        future.set_result(_new_session(*args))  # a refusal raises here, caching nothing
    with _SESSIONS_LOCK:
        _SESSIONS[key] = (future, dict(constants))  # holding the arrays keeps ids unique
        if len(_SESSIONS) > MAX_SESSIONS:
            _SESSIONS.popitem(last=False)
    return future


def wait_background(timeout: float | None = None) -> bool:
    """Wait for the prepacked sessions being built in the background; True when none is
    left (benchmarks call it before timing the steady state)."""
    with _SESSIONS_LOCK:
        pending = [f for f, _ in _SESSIONS.values() if not f.done()]
    not_done = concurrent.futures.wait(pending, timeout=timeout).not_done
    return not not_done


def _mlas_runner(op: str, attrs: dict[str, Any], in_types: list, out_types: list,
                 threads: int, constants: dict[int, np.ndarray]) -> RunFn:
    """The onnxruntime run function for op. With constant weights, their prepacked session
    is built in the background (~3-15 ms each, 0.3-1 s for BERT-base's 72 weights, which
    was most of a warm process's first run); until it is ready, calls run a session shared
    by every call of the same op, attributes, dtypes and ranks, the weights fed as inputs
    (built once in ~0.5 ms; a GEMM runs 1.3-1.5x slower unpacked alone, ~2x beside the
    background build: still, BERT-base's warm first run went from 1.0-1.5 s to 0.4-0.6 s
    on the loaded 2-core machine, against 0.13-0.15 s steady)."""
    if not constants or not BACKGROUND_PREPACK:
        return _bound_runner(_session(op, attrs, in_types, out_types, threads, constants),
                             in_types, out_types, constants)
    future = _session_future(op, attrs, in_types, out_types, threads, constants, True)
    if future.done() and future.exception() is None:
        return _bound_runner(future.result(), in_types, out_types, constants)
    # raises when onnxruntime refuses the op: _build then takes the NumPy implementation
    shared = _session(op, attrs, in_types, out_types, threads, {})
    stand_in = _with_constants(constants, in_types, _bound_runner(shared, in_types,
                                                                   out_types, {}))
    current: list[RunFn | None] = [None]

    def run(inputs: Arrays, outputs: Sequence[np.ndarray]) -> None:
        fast = current[0]
        if fast is None:
            if not future.done():
                stand_in(inputs, outputs)
                return
            # a failed prepacked session leaves the stand-in in place for good
            fast = current[0] = stand_in if future.exception() is not None else \
                _bound_runner(future.result(), in_types, out_types, constants)
        fast(inputs, outputs)

    return run


def _with_constants(constants: dict[int, np.ndarray], in_types: list, run: RunFn) -> RunFn:
    """`run` with the constants fed in their input slots."""
    fed = {i: np.ascontiguousarray(c, in_types[i][0]).reshape(in_types[i][1])
           for i, c in constants.items()}

    def with_constants(inputs: Arrays, outputs: Sequence[np.ndarray]) -> None:
        full = list(inputs)
        for i, value in fed.items():
            full[i] = value
        run(full, outputs)

    return with_constants


def _new_session(op: str, attrs: dict[str, Any], in_types: list, out_types: list,
                 threads: int, constants: dict[int, np.ndarray]) -> ort.InferenceSession:
    """A single-node onnxruntime session for op, its non-constant dims symbolic.

    Constants travel as external initializers (OrtValues over our arrays), not inside the
    serialized model: building, checking and serializing a 768x3072 weight into a model
    took ~80 ms, handing it over takes nothing (MLAS then prepacks it, ~5-15 ms)."""
    names, graph_inputs, inits, external = [], [], [], {}
    for i, t in enumerate(in_types):
        if t is None:
            names.append("")
            continue
        names.append(f"in{i}")
        elem = helper.np_dtype_to_tensor_dtype(t[0])
        if i in constants:
            stub = onnx.TensorProto(name=f"in{i}", data_type=elem, dims=list(t[1]),
                                    data_location=onnx.TensorProto.EXTERNAL)
            stub.external_data.add(key="location", value=f"in{i}")
            inits.append(stub)
            value = np.ascontiguousarray(constants[i], t[0]).reshape(t[1])
            external[f"in{i}"] = ort.OrtValue.ortvalue_from_numpy(value)
        else:
            dims = [f"in{i}_{k}" for k in range(len(t[1]))]
            graph_inputs.append(helper.make_tensor_value_info(f"in{i}", elem, dims))
    outs = [f"out{j}" for j in range(len(out_types))]
    node = helper.make_node(op, names, outs, domain="com.microsoft" if op in CONTRIB else "",
                            **attrs)
    out_info = [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(d),
                                              [f"{o}_{k}" for k in range(len(s))])
                for o, (d, s) in zip(outs, out_types)]
    graph = helper.make_graph([node], f"library_{op}", graph_inputs, out_info, inits)
    imports = [helper.make_opsetid("", OPSET)]
    if op in CONTRIB:
        imports.append(helper.make_opsetid("com.microsoft", 1))
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10  # onnxruntime 1.31 reads IR <= 13; onnx 1.23 writes 14
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = max(threads, 0)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # Spinning threads steal the cores our own kernels run on between calls.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if external:
        so.add_external_initializers(list(external), list(external.values()))
    # Not ort.InferenceSession: under the hook that is autoclust's own session class.
    sess = ort_backend.ORIGINAL_SESSION(model.SerializeToString(), so,
                                        providers=["CPUExecutionProvider"])
    sess._autoclust_keep = external  # the session reads the initializers in place
    return sess


def _bound_runner(sess: ort.InferenceSession, in_types: list, out_types: list,
                  constants: dict[int, np.ndarray]) -> RunFn:
    """Run sess into the callers' arrays, rebinding only arrays not bound last time."""
    fed = [i for i, t in enumerate(in_types) if t is not None and i not in constants]
    binding = sess.io_binding()
    last_in: list[Any] = [None] * len(fed)
    last_out: list[Any] = [None] * len(out_types)

    def run(inputs: Arrays, outputs: Sequence[np.ndarray]) -> None:
        for k, i in enumerate(fed):
            x = inputs[i]
            if x is not last_in[k]:  # holding the array keeps its identity meaningful
                if not isinstance(x, np.ndarray) or not x.flags.c_contiguous:
                    x = np.array(x, order="C")  # keeps 0-d, unlike ascontiguousarray
                binding.bind_cpu_input(f"in{i}", x)
                last_in[k] = inputs[i] if x is inputs[i] else None
        for j, y in enumerate(outputs):
            if y is not last_out[j]:
                binding.bind_ortvalue_output(f"out{j}", ort.OrtValue.ortvalue_from_numpy(y))
                last_out[j] = y
        sess.run_with_iobinding(binding)

    return run


# ---- NumPy ------------------------------------------------------------------------------------

def _staged(run: RunFn, in_types: list, out_types: list) -> RunFn:
    """float16: compute in float32 into staging buffers, round once into the outputs."""
    if not any(t is not None and t[0] == F16 for t in in_types):
        return run
    stage = [np.empty(s, F32) for _, s in out_types]

    def staged(inputs: Arrays, outputs: Sequence[np.ndarray]) -> None:
        wide = [None if x is None else x.astype(F32) for x in inputs]
        run(wide, stage)
        for y, s in zip(outputs, stage):
            np.copyto(y, s, casting="unsafe")

    return staged


def _work_type(t: TypeShape) -> np.dtype:
    return F32 if t[0] == F16 else t[0]


def _numpy_matmul(attrs: dict[str, Any], in_types: list, out_types: list) -> RunFn:
    sa, sb = in_types[0][1], in_types[1][1]
    a2 = (1,) + sa if len(sa) == 1 else sa
    b2 = sb + (1,) if len(sb) == 1 else sb
    m, k, n = a2[-2], a2[-1], b2[-1]
    out_batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    nb = math.prod(out_batch)
    if nb * m * n * k == 0:  # K = 0 sums nothing: zeros (an empty output needs nothing)
        return lambda ins, outs: outs[0].fill(0)
    if in_types[0][0] in INTS or (nb > 1 and m * n * k < 4096):
        # Integers never reach BLAS; tiny stacked problems are cheaper in one ufunc call.
        return lambda ins, outs: np.matmul(ins[0], ins[1], out=outs[0])
    if len(b2) == 2:  # one B for every row of A: a single [batch*M, K] @ [K, N]
        def run2(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
            np.matmul(ins[0].reshape(-1, k), ins[1].reshape(k, n), out=outs[0].reshape(-1, n))
        return run2
    # Broadcast batches: pair each output matrix with its A and B matrices once, here.
    ia = np.broadcast_to(np.arange(math.prod(a2[:-2])).reshape(a2[:-2]), out_batch).ravel()
    ib = np.broadcast_to(np.arange(math.prod(b2[:-2])).reshape(b2[:-2]), out_batch).ravel()
    pairs = list(zip(range(nb), ia.tolist(), ib.tolist()))

    def run(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
        a3, b3 = ins[0].reshape(-1, m, k), ins[1].reshape(-1, k, n)
        o3 = outs[0].reshape(nb, m, n)
        for o, i, j in pairs:
            np.matmul(a3[i], b3[j], out=o3[o])

    return run


def _numpy_gemm(attrs: dict[str, Any], in_types: list, out_types: list) -> RunFn:
    dtype = _work_type(in_types[0])
    trans_a, trans_b = attrs.get("transA", 0), attrs.get("transB", 0)
    alpha = np.asarray(attrs.get("alpha", 1.0), dtype)
    beta = np.asarray(attrs.get("beta", 1.0), dtype)
    has_c = len(in_types) > 2 and in_types[2] is not None

    def run(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
        a = ins[0].T if trans_a else ins[0]
        b = ins[1].T if trans_b else ins[1]
        y = outs[0]
        np.matmul(a, b, out=y)  # BLAS takes the transposed views without a copy
        if alpha != 1:
            np.multiply(y, alpha, out=y)
        if has_c:
            np.add(y, ins[2] if beta == 1 else ins[2] * beta, out=y)

    return run


def _padded(x_shape: tuple, begins: Sequence[int], sizes: Sequence[int], dtype: np.dtype,
            fill: Any) -> tuple[np.ndarray, tuple]:
    """A buffer (N, C, *sizes) filled with `fill` and the slice where x goes."""
    buf = np.full(tuple(x_shape[:2]) + tuple(sizes), fill, dtype)
    inner = (slice(None), slice(None)) + tuple(slice(b, b + d) for b, d in
                                               zip(begins, x_shape[2:]))
    return buf, inner


def _window_geometry(x_shape: tuple, kernel: Sequence[int], attrs: dict[str, Any],
                     pool: bool) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """(out dims, pads begin, padded sizes, strides, dilations) of a sliding window."""
    ns = len(kernel)
    strides = list(attrs.get("strides") or [1] * ns)
    dil = list(attrs.get("dilations") or [1] * ns)
    out, pb, pe = window_pads(x_shape[2:], kernel, attrs, pool)
    # ceil_mode windows may run past the end pad: the buffer covers them too.
    sizes = [max(d + b + e, (o - 1) * s + (k - 1) * dd + 1)
             for d, b, e, o, s, k, dd in zip(x_shape[2:], pb, pe, out, strides, kernel, dil)]
    return out, pb, sizes, strides, dil


def _offset_views(xp: np.ndarray, out: Sequence[int], kernel: Sequence[int],
                  strides: Sequence[int], dil: Sequence[int]) -> list[np.ndarray]:
    """For each kernel offset, the strided view of xp (N, C, *out) it reads."""
    views = []
    for off in np.ndindex(*kernel):
        idx = tuple(slice(o * d, o * d + s * (n - 1) + 1, s)
                    for o, d, s, n in zip(off, dil, strides, out))
        views.append(xp[(slice(None), slice(None)) + idx])
    return views


def _numpy_conv(attrs: dict[str, Any], in_types: list, out_types: list) -> RunFn:
    x_shape, w_shape = in_types[0][1], in_types[1][1]
    dtype, kernel = _work_type(in_types[0]), list(w_shape[2:])
    group, has_bias = int(attrs.get("group", 1)), len(in_types) > 2 and in_types[2] is not None
    out, pb, sizes, strides, dil = _window_geometry(x_shape, kernel, attrs, pool=False)
    n, m, cg = x_shape[0], w_shape[0], w_shape[1]
    mg, p, ksize = m // group, math.prod(out), math.prod(kernel)
    needs_pad = list(sizes) != list(x_shape[2:])
    xp, inner = _padded(x_shape, pb, sizes, dtype, 0)
    bias_shape = (1, m) + (1,) * len(out)

    def load(x: np.ndarray) -> np.ndarray:
        if not needs_pad:
            return x
        xp[inner] = x  # the pad border stays zero from allocation
        return xp

    if cg == 1 and group > 1:
        return _depthwise(load, dtype, out, strides, dil, kernel, (n, group, mg), has_bias)
    pointwise = ksize == 1 and not needs_pad and all(s == 1 for s in strides)
    cols = np.empty((cg * ksize, p), dtype)
    # cols (cg, *kernel, *out) <- window view (cg, *out, *kernel): offsets move in front.
    ns = len(out)
    order = (0,) + tuple(range(1 + ns, 1 + 2 * ns)) + tuple(range(1, 1 + ns))
    cols_view = cols.reshape((cg, *kernel, *out))

    def run(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
        w = ins[1].reshape(group, mg, cg * ksize)
        y = outs[0].reshape(n, group, mg, p)
        src = load(ins[0])
        win = None if pointwise else _window_view(src, out, kernel, strides, dil)
        for b in range(n):
            for g in range(group):
                if pointwise:
                    c = src[b, g * cg:(g + 1) * cg].reshape(cg, p)
                else:
                    np.copyto(cols_view, win[b, g * cg:(g + 1) * cg].transpose(order))
                    c = cols
                np.matmul(w[g], c, out=y[b, g])
        if has_bias:
            np.add(outs[0], ins[2].reshape(bias_shape), out=outs[0])

    return run


def _window_view(xp: np.ndarray, out: Sequence[int], kernel: Sequence[int],
                 strides: Sequence[int], dil: Sequence[int]) -> np.ndarray:
    """Read-only view (N, C, *out, *kernel) of the padded input."""
    ns = len(kernel)
    st = xp.strides[2:]
    shape = xp.shape[:2] + tuple(out) + tuple(kernel)
    view_strides = (xp.strides[:2] + tuple(st[i] * strides[i] for i in range(ns))
                    + tuple(st[i] * dil[i] for i in range(ns)))
    return np.lib.stride_tricks.as_strided(xp, shape, view_strides, writeable=False)


def _depthwise(load: Callable, dtype: np.dtype, out: list[int], strides: list[int],
               dil: list[int], kernel: list[int], ngm: tuple[int, int, int],
               has_bias: bool) -> RunFn:
    """Conv with one input channel per group: a multiply-add per kernel offset, no matmul."""
    n, group, mg = ngm
    ns = len(out)
    tmp = np.empty((n, group, mg, *out), dtype)

    def run(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
        src = load(ins[0])
        views = _offset_views(src, out, kernel, strides, dil)
        w = ins[1].reshape(group, mg, -1)
        y = outs[0].reshape(n, group, mg, *out)
        for k, v in enumerate(views):
            xk = v.reshape(n, group, 1, *out)
            wk = w[:, :, k].reshape((1, group, mg) + (1,) * ns)
            if k == 0:
                np.multiply(xk, wk, out=y)
            else:
                np.multiply(xk, wk, out=tmp)
                np.add(y, tmp, out=y)
        if has_bias:
            y += ins[2].reshape((1, group, mg) + (1,) * ns)

    return run


def _numpy_pool(attrs: dict[str, Any], in_types: list, out_types: list) -> RunFn:
    x_shape, dtype = in_types[0][1], _work_type(in_types[0])
    kernel = list(attrs["kernel_shape"])
    is_max = attrs.get("_op") == "MaxPool"
    out, pb, sizes, strides, dil = _window_geometry(x_shape, kernel, attrs, pool=True)
    if is_max:
        fill = -np.inf if dtype.kind == "f" else np.iinfo(dtype).min
    else:
        fill = 0
    xp, inner = _padded(x_shape, pb, sizes, dtype, fill)
    views = _offset_views(xp, out, kernel, strides, dil)
    count = None if is_max else _pool_count(x_shape, attrs, pb, sizes, out, strides, dil,
                                            dtype)

    def run(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
        xp[inner] = ins[0]
        y = outs[0]
        np.copyto(y, views[0])
        combine = np.maximum if is_max else np.add
        for v in views[1:]:
            combine(y, v, out=y)
        if count is not None:
            np.divide(y, count, out=y)

    return run


def _pool_count(x_shape: tuple, attrs: dict[str, Any], pb: list[int], sizes: list[int],
                out: list[int], strides: list[int], dil: list[int], dtype: np.dtype
                ) -> np.ndarray:
    """AveragePool divisor per output position: real elements (plus explicit pads)."""
    kernel = list(attrs["kernel_shape"])
    mask = np.zeros((1, 1, *sizes), dtype)
    if attrs.get("count_include_pad", 0):
        _, _, pe = window_pads(x_shape[2:], kernel, attrs, True)
        region = tuple(slice(0, d + b + e) for d, b, e in zip(x_shape[2:], pb, pe))
    else:
        region = tuple(slice(b, b + d) for b, d in zip(pb, x_shape[2:]))
    mask[(slice(None), slice(None)) + region] = 1
    views = _offset_views(mask, out, kernel, strides, dil)
    total = np.zeros((1, 1, *out), dtype)
    for v in views:
        total += v
    return total


def _numpy_global_pool(attrs: dict[str, Any], in_types: list, out_types: list) -> RunFn:
    n, c = in_types[0][1][:2]
    reduce = np.max if attrs.get("_op") == "GlobalMaxPool" else np.mean

    def run(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
        reduce(ins[0].reshape(n, c, -1), axis=2, out=outs[0].reshape(n, c))

    return run


def _numpy_einsum(attrs: dict[str, Any], in_types: list, out_types: list) -> RunFn:
    eq = attrs["equation"]
    probes = [np.empty(t[1], _work_type(t)) for t in in_types if t is not None]
    path, _ = np.einsum_path(eq, *probes, optimize="greedy")
    if len(path) <= 2:  # one contraction: the default path keeps out= zero-copy
        path = False

    def run(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
        np.einsum(eq, *[x for x in ins if x is not None], out=outs[0], optimize=path)

    return run


def _ref_run(op: str, attrs: dict[str, Any]) -> RunFn:
    """The op's NumPy reference, copied into the outputs (ConvTranspose, MaxPool Indices)."""
    ref = ops.get(op).ref

    def run(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
        for y, r in zip(outs, ref(list(ins), attrs)):
            np.copyto(y, r, casting="unsafe")

    return run


def _numpy_fused_matmul(attrs: dict[str, Any], in_types: list, out_types: list) -> RunFn:
    alpha = attrs.get("alpha", 1.0)
    trans_a, trans_b = attrs.get("transA", 0), attrs.get("transB", 0)

    def run(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
        a = np.swapaxes(ins[0], -1, -2) if trans_a else ins[0]
        b = np.swapaxes(ins[1], -1, -2) if trans_b else ins[1]
        np.matmul(a, b, out=outs[0])
        if alpha != 1.0:
            np.multiply(outs[0], np.asarray(alpha, outs[0].dtype), out=outs[0])

    return run


NUMPY_BUILDERS: dict[str, Callable[[dict, list, list], RunFn]] = {
    "FusedMatMul": _numpy_fused_matmul,
    "MatMul": _numpy_matmul,
    "Gemm": _numpy_gemm,
    "Conv": _numpy_conv,
    "MaxPool": lambda a, i, o: _numpy_pool({**a, "_op": "MaxPool"}, i, o),
    "AveragePool": _numpy_pool,
    "GlobalAveragePool": _numpy_global_pool,
    "GlobalMaxPool": lambda a, i, o: _numpy_global_pool({**a, "_op": "GlobalMaxPool"}, i, o),
    "Einsum": _numpy_einsum,
}


# ---- helpers -----------------------------------------------------------------------------------

def _freeze(value: Any) -> Any:
    """A hashable copy of an attribute value (lists become tuples, arrays bytes)."""
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    return value


def _describe(in_types: Sequence[TypeShape | None]) -> str:
    return ", ".join("None" if t is None else f"{t[0]}{list(t[1])}" for t in in_types)


