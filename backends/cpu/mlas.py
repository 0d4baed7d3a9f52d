"""onnxruntime's kernels (MLAS) for one op: a single-node session over our arrays.

`new_session` builds the session (its non-constant dims symbolic, constant weights handed
over in place so MLAS prepacks them); `bound_runner` runs it into the caller's arrays
through an io_binding. library.py caches the sessions and chooses when to use them.

Sessions come from onnxruntime's C API (backends/ort/capi.py), all sharing one intra-op
thread pool, or where that is unavailable from its Python binding, a pool each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from autoclust.backends import ort as ort_backend
from autoclust.backends.cpu.numpy_library import Arrays, RunFn
from autoclust.backends.ort import capi
from onnx import helper

OPSET = 18
# Whether the shared pool's worker spins between calls. Off: the chain of 12 GEMMs ran 3%
# faster with it, but the worker spins on for milliseconds after the last call and took
# the cores from what ran next (onnxruntime's own session, alternating: 11.9 -> 13.2-13.5
# ms), as the user's code after a run would lose them.
SPIN = False
CONTRIB = ("FusedMatMul",)  # ops of onnxruntime's com.microsoft domain


Session = ort.InferenceSession | capi.Session


def new_session(op: str, attrs: dict[str, Any], in_types: list, out_types: list,
                threads: int, constants: dict[int, np.ndarray]) -> Session:
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
            external[f"in{i}"] = np.ascontiguousarray(constants[i], t[0]).reshape(t[1])
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
    dtypes = [t[0] for t in in_types if t is not None] + [t[0] for t in out_types]
    shared = capi.env(max(threads, 1), SPIN) if capi.supports(dtypes) else None
    if shared is not None:
        return capi.Session(shared, model.SerializeToString(), external)
    return _binding_session(model, threads, external)


def _binding_session(model: onnx.ModelProto, threads: int,
                     external: dict[str, np.ndarray]) -> ort.InferenceSession:
    """The session through onnxruntime's Python binding, with a thread pool of its own."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = max(threads, 0)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # Spinning threads steal the cores our own kernels run on between calls.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    values = [ort.OrtValue.ortvalue_from_numpy(a) for a in external.values()]
    if external:
        so.add_external_initializers(list(external), values)
    # Not ort.InferenceSession: under the hook that is autoclust's own session class.
    sess = ort_backend.ORIGINAL_SESSION(model.SerializeToString(), so,
                                        providers=["CPUExecutionProvider"])
    sess._autoclust_keep = values  # the session reads the initializers in place
    return sess


def stand_in(kept: dict[int, np.ndarray], k: int, like: np.ndarray) -> np.ndarray:
    """A C-contiguous array of `like`'s shape and dtype, kept as kept[k] for later calls
    (a strided operand's dense copy: bound_runner's inputs, LibraryFn's outputs)."""
    d = kept.get(k)
    if d is None or d.shape != like.shape or d.dtype != like.dtype:
        d = kept[k] = np.empty(like.shape, like.dtype)
    return d


def bound_runner(sess: Session, in_types: list, out_types: list,
                 constants: dict[int, np.ndarray]) -> RunFn:
    """Run sess into the callers' arrays, rebinding only arrays not bound last time. A
    strided input (a view: V among the fused Q, K, V) is copied into a dense stand-in kept
    for the next call: bound afresh each call (onnxruntime copying it again), Whisper's
    [6, 750, 750] x [6, 750, 64] P.V took 1.6x its time on a dense V."""
    fed = [i for i, t in enumerate(in_types) if t is not None and i not in constants]
    bind, run_bound = _binder(sess)
    last_in: list[Any] = [None] * len(fed)
    last_out: list[Any] = [None] * len(out_types)
    stand_ins: dict[int, np.ndarray] = {}

    def run(inputs: Arrays, outputs: Sequence[np.ndarray]) -> None:
        for k, i in enumerate(fed):
            x = inputs[i]
            if not isinstance(x, np.ndarray):
                x = np.array(x, order="C")  # keeps 0-d, unlike ascontiguousarray
            elif not x.flags.c_contiguous:
                d = stand_in(stand_ins, k, x)
                np.copyto(d, x)
                x = d
            if x is not last_in[k]:  # holding the array keeps its identity meaningful
                bind(f"in{i}", x, False)
                last_in[k] = x
        for j, y in enumerate(outputs):
            if y is not last_out[j]:
                bind(f"out{j}", y, True)
                last_out[j] = y
        run_bound()

    return run


def _binder(sess: Session) -> tuple[Callable[[str, np.ndarray, bool], None],
                                    Callable[[], None]]:
    """(bind(name, array, output), run()) over a new io binding of sess."""
    if isinstance(sess, capi.Session):
        binding = sess.binding()
        return binding.bind, binding.run
    py_binding = sess.io_binding()

    def bind(name: str, x: np.ndarray, output: bool) -> None:
        if output:
            py_binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(x))
        else:
            py_binding.bind_cpu_input(name, x)

    return bind, lambda: sess.run_with_iobinding(py_binding)
