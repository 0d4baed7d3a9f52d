"""MLAS through onnxruntime: the CPU backend's library calls run as single-node sessions.

A single-node onnxruntime session (ORT_ENABLE_ALL, spinning off, compile-time constants as
initializers so MLAS prepacks weights) runs through an io_binding whose outputs are
OrtValues over our arrays. The binding is rebuilt only when a caller passes different
array objects than last time (binding memory is shared, not copied). Sessions are shared
by every call of the same op, attributes, dtypes and ranks on the same constants, and
weights' prepacking sessions are built in a background thread (see `runner`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from autoclust.backends import ort as ort_backend
from autoclust.backends.cpu.call_types import Arrays, RunFn, describe, freeze
from onnx import helper

from autoclust.errors import UnsupportedOpError

OPSET = 18
CONTRIB = ("FusedMatMul",)  # ops of onnxruntime's com.microsoft domain

# Single-node sessions, reused by every call of the same op, attributes, dtypes and ranks
# on the same constant arrays: their dims are symbolic, so a new sequence length or batch
# size reuses them (and their prepacked weights) instead of building 96 sessions again for
# BERT-base. Bounded: the least recently used session goes (and frees its weights).
# Values are (future of the session, its constants).
SESSIONS: collections.OrderedDict = collections.OrderedDict()
_LOCK = threading.Lock()
MAXSESSIONS = 256
# Build weight-prepacking sessions in one background thread (see runner); tests
# turn it off to check the synchronous path.
BACKGROUND_PREPACK = True
_BACKGROUND: dict[str, concurrent.futures.ThreadPoolExecutor] = {}


def forced(op: str, attrs: dict[str, Any], in_types: list, out_types: list,
                 threads: int, constants: dict[int, np.ndarray]) -> Callable:
    try:
        sess = session(op, attrs, in_types, out_types, threads, constants)
    except Exception as exc:  # noqa: BLE001 - turned into our error below
        raise UnsupportedOpError(f"{op} on {describe(in_types)}: implementation 'mlas' is "
                                 f"not available: onnxruntime refused it ({exc})") from None
    return lambda: bound_runner(sess, in_types, out_types, constants)



def session(op: str, attrs: dict[str, Any], in_types: list, out_types: list, threads: int,
             constants: dict[int, np.ndarray]) -> ort.InferenceSession:
    """The single-node onnxruntime session for op (cached in SESSIONS), built now."""
    return session_future(op, attrs, in_types, out_types, threads, constants, False).result()


def session_future(op: str, attrs: dict[str, Any], in_types: list, out_types: list,
                    threads: int, constants: dict[int, np.ndarray],
                    background: bool) -> concurrent.futures.Future:
    """A future of the session for op (cached in SESSIONS): built in the background
    thread when `background`, else now (raising what onnxruntime raises)."""
    key = (op, freeze(attrs), tuple(None if t is None else (t[0], len(t[1]), i in constants
                                                             and t[1]) for i, t in
                                     enumerate(in_types)),
           tuple((t[0], len(t[1])) for t in out_types), threads,
           tuple((i, id(c)) for i, c in sorted(constants.items())))
    with _LOCK:
        hit = SESSIONS.get(key)
        if hit is not None and all(hit[1][i] is c for i, c in constants.items()):
            SESSIONS.move_to_end(key)
            return hit[0]
    args = (op, attrs, in_types, out_types, threads, constants)
    if background:
        with _LOCK:
            if _BACKGROUND.get("pool") is None:
                _BACKGROUND["pool"] = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="autoclust-prepack")
            future = _BACKGROUND["pool"].submit(new_session, *args)
    else:
        future = concurrent.futures.Future()
        future.set_result(new_session(*args))  # a refusal raises here, caching nothing
    with _LOCK:
        SESSIONS[key] = (future, dict(constants))  # holding the arrays keeps ids unique
        if len(SESSIONS) > MAXSESSIONS:
            SESSIONS.popitem(last=False)
    return future


def wait_background(timeout: float | None = None) -> bool:
    """Wait for the prepacked sessions being built in the background; True when none is
    left (benchmarks call it before timing the steady state)."""
    with _LOCK:
        pending = [f for f, _ in SESSIONS.values() if not f.done()]
    not_done = concurrent.futures.wait(pending, timeout=timeout).not_done
    return not not_done


def runner(op: str, attrs: dict[str, Any], in_types: list, out_types: list,
                 threads: int, constants: dict[int, np.ndarray]) -> RunFn:
    """The onnxruntime run function for op. With constant weights, their prepacked session
    is built in the background (~3-15 ms each, 0.3-1 s for BERT-base's 72 weights, which
    was most of a warm process's first run); until it is ready, calls run a session shared
    by every call of the same op, attributes, dtypes and ranks, the weights fed as inputs
    (built once in ~0.5 ms; a GEMM runs 1.3-1.5x slower unpacked alone, ~2x beside the
    background build: still, BERT-base's warm first run went from 1.0-1.5 s to 0.4-0.6 s
    on the loaded 2-core machine, against 0.13-0.15 s steady)."""
    if not constants or not BACKGROUND_PREPACK:
        return bound_runner(session(op, attrs, in_types, out_types, threads, constants),
                             in_types, out_types, constants)
    future = session_future(op, attrs, in_types, out_types, threads, constants, True)
    if future.done() and future.exception() is None:
        return bound_runner(future.result(), in_types, out_types, constants)
    # raises when onnxruntime refuses the op: _build then takes the NumPy implementation
    shared = session(op, attrs, in_types, out_types, threads, {})
    stand_in = with_constants(constants, in_types, bound_runner(shared, in_types,
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
                bound_runner(future.result(), in_types, out_types, constants)
        fast(inputs, outputs)

    return run


def with_constants(constants: dict[int, np.ndarray], in_types: list, run: RunFn) -> RunFn:
    """`run` with the constants fed in their input slots."""
    fed = {i: np.ascontiguousarray(c, in_types[i][0]).reshape(in_types[i][1])
           for i, c in constants.items()}

    def with_constants(inputs: Arrays, outputs: Sequence[np.ndarray]) -> None:
        full = list(inputs)
        for i, value in fed.items():
            full[i] = value
        run(full, outputs)

    return with_constants


def new_session(op: str, attrs: dict[str, Any], in_types: list, out_types: list,
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


def bound_runner(sess: ort.InferenceSession, in_types: list, out_types: list,
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
