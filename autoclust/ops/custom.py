"""Custom calls: bring your own kernel (XLA's CustomCall, for autoclust).

    autoclust.register_op("my.ops", "Swish", infer=same_shape, kernel=lib.swish)

registers op `Swish` of domain `my.ops`. A model node of that op then clusters like a
library call (MatMul, Conv): inside a compiled cluster it is a LibraryCall thunk between
the generated kernels, its inputs and outputs are buffers passed by pointer, and its output
buffers are preallocated from its `infer` rule. onnxruntime cannot load such a node, so no
onnxruntime session is ever built for one:
- a custom node outside every cluster (--auto_jit=0, a cluster under --min_cluster_size,
  an unsupported dtype nearby) runs in autoclust's runtime with its kernel, as its own
  step between the onnxruntime segments (clustering.FallbackSegment with host=True);
- a cluster holding a custom node that fails to compile (or is megamorphic, or waits for
  an --async_compile) runs in autoclust's runtime too: custom nodes with their kernels,
  the other nodes with their NumPy references (the interpreter), with the usual warning.

The parts of a registration:
- `infer(dtypes, shapes, attrs) -> [(dtype, shape), ...]`, one pair per output. dtypes are
  numpy dtypes, shapes tuples whose dims are ints, or str/None for dims unknown when the
  model is loaded (then return None for a dim or a shape you cannot know); attrs are the
  node's attributes. Raise any exception to reject the inputs: it becomes a
  ShapeInferenceError naming the op and the node.
- `kernel`, one of
  * a NumPy function `kernel(inputs, attrs) -> array or list of arrays` (inputs: list of
    C-contiguous arrays, None for an omitted optional input). Each result must have the
    dtype and shape `infer` gave; it is copied into the preallocated output buffer.
  * a C function as a ctypes function object (`ctypes.CDLL(path).my_fn`) or its address
    (an int), with exactly this signature:

        int32_t fn(void **inputs, void **outputs, const int64_t *dims,
                   const int64_t *ranks, int32_t n_inputs, int32_t n_outputs);

    inputs[i] points to input i's data (NULL for an omitted optional input), outputs[j] to
    output j's preallocated buffer; every tensor is dense, row-major (C order), of the
    dtype `infer` gave (inputs: the model's dtypes). ranks[k] is the rank of input k for
    k < n_inputs and of output k - n_inputs after that; dims holds every tensor's dims
    back to back in that same order (inputs first, then outputs; an omitted input has rank
    0 and no dims). Return 0 on success; any other value is an error code, raised as a
    KernelError naming the op and the node. The kernel must not keep the pointers after it
    returns, must write every element of each output, and may be called from several
    threads at once (separate buffers). Attributes do not reach C kernels: bake them in,
    or use a NumPy kernel.
- `ref(inputs, attrs) -> list of arrays`: the NumPy reference (the semantics: constant
  folding, `--device=interpreter`, `--check_numerics`' node search and the tests). Without
  one, the kernel is the reference.
- `gpu_kernel` (for --device=gpu): a C function with the same signature as above, called
  with device pointers (it launches its work on the current CUDA stream, CuPy's current
  stream, before returning), or a Python function `gpu_kernel(inputs, outputs, attrs)` on
  CuPy arrays that fills `outputs`. Without one, the GPU backend runs `kernel` on the host
  with copies (slow, but correct).
- `dtypes`: the dtypes a cluster may hand the op (default: every dtype autoclust
  compiles; a node with other dtypes stays outside clusters and runs in the runtime).

Errors (all autoclust.errors.AutoclustError): RegistrationError for a second
registration, a standard-domain op, an op_type that already names a library call, or a
kernel/infer/ref that is not callable with the documented arguments; ShapeInferenceError
for rejected inputs or an infer result that is not one (dtype, shape) per output;
KernelError for a kernel that raises, returns an error code, or returns results of the
wrong number, dtype or shape. Every message names the op (domain::op_type) and the node.

Constraint: LibraryCall thunks name ops by op_type alone, so one op_type is one custom op
(`my.ops::Swish` and `other::Swish` cannot both be registered).
"""

from __future__ import annotations

import ctypes
import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from autoclust import ops
from autoclust.errors import (
    AutoclustError,
    KernelError,
    RegistrationError,
    ShapeInferenceError,
)
from autoclust.ir import Graph, Node

# int32_t fn(void **inputs, void **outputs, const int64_t *dims, const int64_t *ranks,
#            int32_t n_inputs, int32_t n_outputs)
C_KERNEL = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p),
                            ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64),
                            ctypes.POINTER(ctypes.c_int64), ctypes.c_int32, ctypes.c_int32)
_C_ARGTYPES = C_KERNEL._argtypes_
STANDARD_DOMAINS = ("", "ai.onnx")
Arrays = Sequence[np.ndarray | None]


@dataclasses.dataclass(frozen=True)
class CustomOp:
    """One registered custom op (see the module docstring for each field's contract)."""

    domain: str
    op_type: str
    infer: Callable[..., Any]
    kernel: Callable[..., Any] | None      # a NumPy kernel
    c_kernel: Any                          # a C_KERNEL, or None
    ref: Callable[..., Any] | None
    gpu_kernel: Any = None                 # a C_KERNEL or a Python function over CuPy arrays
    opdef: ops.OpDef | None = None

    @property
    def name(self) -> str:
        return f"{self.domain}::{self.op_type}"

    def where(self, node_name: str = "") -> str:
        return f"custom op {self.name}" + (f" (node {node_name!r})" if node_name else "")


_REGISTRY: dict[tuple[str, str], CustomOp] = {}
_BY_OP_TYPE: dict[str, CustomOp] = {}


# ---- registering -----------------------------------------------------------------------------

def register_op(domain: str, op_type: str, *, infer: Callable[..., Any],
                kernel: Any = None, ref: Callable[..., Any] | None = None,
                gpu_kernel: Any = None, dtypes: Sequence[Any] | None = None,
                doc: str = "") -> CustomOp:
    """Register custom op domain::op_type; see the module docstring for the contract."""
    name = f"{domain}::{op_type}"
    if not isinstance(domain, str) or not isinstance(op_type, str) or not op_type:
        raise RegistrationError(f"custom op {name}: domain and op_type must be strings")
    if domain in STANDARD_DOMAINS:
        raise RegistrationError(f"custom op {name}: custom ops need their own domain (not the "
                                "standard ONNX domain, whose ops onnxruntime runs)")
    if (domain, op_type) in _REGISTRY or ops.get(op_type, domain) is not None:
        raise RegistrationError(f"custom op {name} is already registered")
    clash = _library_clash(op_type)
    if clash:
        raise RegistrationError(f"custom op {name}: op_type {op_type!r} already names {clash}; "
                                "library calls are dispatched by op_type, pick another name")
    _check_callable(name, "infer", infer, 3)
    if ref is not None:
        _check_callable(name, "ref", ref, 2)
    if kernel is None and ref is None:
        raise RegistrationError(f"custom op {name}: give a kernel, a ref or both")
    c_kernel, py_kernel = _split_kernel(name, "kernel", kernel)
    if gpu_kernel is not None:
        gpu_c, gpu_py = _split_kernel(name, "gpu_kernel", gpu_kernel, n_args=3)
        gpu_kernel = gpu_c if gpu_c is not None else gpu_py
    allowed = ops.COMPILABLE_TYPES if dtypes is None else frozenset(np.dtype(t) for t in dtypes)
    op = CustomOp(domain, op_type, infer, py_kernel, c_kernel, ref, gpu_kernel)
    opdef = ops.register_external(op_type, domain, ops.LIBRARY, _infer_rule(op), _ref_rule(op),
                                  dtypes=allowed, doc=doc or f"custom op {name}")
    op = dataclasses.replace(op, opdef=opdef)
    _REGISTRY[(domain, op_type)] = op
    _BY_OP_TYPE[op_type] = op
    return op


def unregister_op(domain: str, op_type: str) -> None:
    """Remove a custom op (sessions built while it was registered keep working)."""
    op = _REGISTRY.pop((domain, op_type), None)
    if op is None:
        raise RegistrationError(f"custom op {domain}::{op_type} is not registered")
    _BY_OP_TYPE.pop(op_type, None)
    ops.unregister_external(op_type, domain)


def get(domain: str, op_type: str) -> CustomOp | None:
    """The custom op domain::op_type, or None."""
    return _REGISTRY.get(("" if domain == "ai.onnx" else domain, op_type))


def for_call(op_type: str) -> CustomOp | None:
    """The custom op a LibraryCall thunk of op `op_type` calls, or None."""
    return _BY_OP_TYPE.get(op_type)


def is_custom(node: Node) -> bool:
    """Whether `node` is a custom op: onnxruntime cannot run it, our runtime must."""
    return ops.is_external(node.op, node.domain)


def in_graph(graph: Graph) -> bool:
    """Whether any node of `graph` is a custom op."""
    return any(is_custom(n) for n in graph.nodes)


def in_model(model: Any) -> bool:
    """Whether an ONNX ModelProto uses a registered custom op (If/Loop/Scan bodies too)."""
    return in_graph_proto(model.graph)


def in_subgraphs(node: Node) -> bool:
    """Whether an If/Loop/Scan node's bodies (graph attributes) use a custom op."""
    return any(in_graph_proto(a.g) for a in node.attrs.values()
               if hasattr(a, "HasField") and a.HasField("g"))


def in_graph_proto(graph: Any) -> bool:
    """Whether an onnx GraphProto, or a subgraph of one of its nodes, uses a custom op."""
    for n in graph.node:
        if ops.is_external(n.op_type, "" if n.domain == "ai.onnx" else n.domain):
            return True
        for a in n.attribute:
            if (a.HasField("g") and in_graph_proto(a.g)) or any(in_graph_proto(g)
                                                                  for g in a.graphs):
                return True
    return False


def _library_clash(op_type: str) -> str:
    for d in ops.all_ops():
        if d.op == op_type and d.kind == ops.LIBRARY:
            return f"the library op {d.domain + '::' if d.domain else ''}{d.op}"
    return ""


def _check_callable(name: str, what: str, fn: Any, n_args: int) -> None:
    if not callable(fn):
        raise RegistrationError(f"custom op {name}: {what} must be callable, got "
                                f"{type(fn).__name__}")
    try:
        inspect.signature(fn).bind(*range(n_args))
    except TypeError as exc:
        raise RegistrationError(f"custom op {name}: {what} must take {n_args} positional "
                                f"arguments ({exc})") from None
    except ValueError:  # no signature to read (a builtin): trust it
        pass


def _split_kernel(name: str, what: str, kernel: Any, n_args: int = 2) -> tuple[Any, Any]:
    """(C function, None) or (None, Python function) for a kernel argument."""
    if kernel is None:
        return None, None
    if isinstance(kernel, int) and not isinstance(kernel, bool):
        if kernel == 0:
            raise RegistrationError(f"custom op {name}: {what} is a NULL function pointer")
        return C_KERNEL(kernel), None
    if isinstance(kernel, ctypes._CFuncPtr):
        argtypes = getattr(kernel, "argtypes", None)
        if argtypes is not None and tuple(argtypes) != tuple(_C_ARGTYPES):
            raise RegistrationError(
                f"custom op {name}: {what} is a C function with argtypes {list(argtypes)}; "
                "the signature must be int32_t fn(void **inputs, void **outputs, "
                "const int64_t *dims, const int64_t *ranks, int32_t n_inputs, "
                "int32_t n_outputs)")
        return ctypes.cast(kernel, C_KERNEL), None
    _check_callable(name, what, kernel, n_args)
    return None, kernel


# ---- the op table's rules ----------------------------------------------------------------------

def _infer_rule(op: CustomOp) -> ops.InferFn:
    def infer(ctx: ops.InferContext) -> list[ops.TypeShape]:
        try:
            result = op.infer(list(ctx.dtypes), [None if s is None else tuple(s)
                                                 for s in ctx.shapes], dict(ctx.attrs))
        except Exception as exc:  # noqa: BLE001 - any rejection becomes our error
            raise _infer_error(op, ctx.node_name, f"infer rejected inputs "
                               f"{_describe(ctx.dtypes, ctx.shapes)}: "
                               f"{type(exc).__name__}: {exc}") from None
        return _checked_types(op, ctx.node_name, result)
    return infer


def _infer_error(op: CustomOp, node_name: str, message: str) -> ShapeInferenceError:
    return ShapeInferenceError(f"{op.where(node_name)}: {message}")


def _checked_types(op: CustomOp, node_name: str, result: Any) -> list[ops.TypeShape]:
    """infer's result as [(np.dtype, shape tuple or None)], or ShapeInferenceError."""
    if isinstance(result, tuple) and len(result) == 2 and not isinstance(result[0], tuple):
        result = [result]  # one output given as a bare (dtype, shape) pair
    if not isinstance(result, list | tuple) or not result:
        raise _infer_error(op, node_name, f"infer must return a list of (dtype, shape) pairs, "
                           f"got {result!r}")
    out = []
    for k, pair in enumerate(result):
        try:
            dtype, shape = pair
            dtype = np.dtype(dtype)
            shape = None if shape is None else tuple(
                d if d is None or isinstance(d, str) else _dim(d) for d in shape)
        except (TypeError, ValueError) as exc:
            raise _infer_error(op, node_name, f"infer output {k} is not a (dtype, shape) "
                               f"pair: {pair!r} ({exc})") from None
        out.append((dtype, shape))
    return out


def _dim(d: Any) -> int:
    d = int(d) if isinstance(d, int | np.integer) else None
    if d is None or d < 0:
        raise ValueError("dims are non-negative ints, str or None")
    return d


def _ref_rule(op: CustomOp) -> ops.RefFn:
    def ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
        if op.ref is not None:
            return _call_numpy(op, op.ref, inputs, attrs, "", "ref")
        return run_kernel(op, list(inputs), attrs)
    return ref


# ---- running kernels -----------------------------------------------------------------------

def output_types(op: CustomOp, inputs: Arrays, attrs: dict[str, Any], node_name: str = "",
                 n_outputs: int | None = None) -> list[tuple[np.dtype, tuple[int, ...]]]:
    """infer on concrete inputs: every output's dtype and (fully known) shape."""
    ctx = ops.InferContext(op.op_type, [None if x is None else x.dtype for x in inputs],
                           [None if x is None else x.shape for x in inputs],
                           list(inputs), attrs, [x is not None for x in inputs], node_name)
    types = op.opdef.infer(ctx)
    if n_outputs is not None and len(types) != n_outputs:
        raise _infer_error(op, node_name, f"infer gave {len(types)} outputs, the node has "
                           f"{n_outputs}")
    for k, (_, shape) in enumerate(types):
        if shape is None or not all(isinstance(d, int) for d in shape):
            raise _infer_error(op, node_name, f"infer gave output {k} shape {shape} for "
                               f"concrete inputs {_describe(ctx.dtypes, ctx.shapes)}")
    return types


def run_kernel(op: CustomOp, inputs: list[np.ndarray | None], attrs: dict[str, Any],
               node_name: str = "", n_outputs: int | None = None) -> list[np.ndarray]:
    """Run op's kernel on host arrays: outputs allocated from infer, then filled."""
    inputs = [None if x is None else _dense(np.asarray(x)) for x in inputs]
    types = output_types(op, inputs, attrs, node_name, n_outputs)
    outputs = [np.empty(shape, dtype) for dtype, shape in types]
    call_into(op, inputs, outputs, attrs, node_name)
    return outputs


def call_into(op: CustomOp, inputs: Arrays, outputs: Sequence[np.ndarray],
              attrs: dict[str, Any], node_name: str = "") -> None:
    """Run op's kernel writing into preallocated C-contiguous `outputs`."""
    if op.c_kernel is not None:
        CCall(op, node_name)(inputs, outputs)
        return
    fn = op.kernel if op.kernel is not None else op.ref
    results = _call_numpy(op, fn, inputs, attrs, node_name, "kernel")
    if len(results) != len(outputs):
        raise KernelError(f"{op.where(node_name)}: kernel returned {len(results)} arrays for "
                          f"{len(outputs)} outputs")
    for k, (y, r) in enumerate(zip(outputs, results)):
        if r.shape != y.shape or r.dtype != y.dtype:
            raise KernelError(f"{op.where(node_name)}: kernel output {k} is "
                              f"{r.dtype}{list(r.shape)}, infer says {y.dtype}{list(y.shape)}")
        np.copyto(y, r)


def _call_numpy(op: CustomOp, fn: Callable[..., Any], inputs: Arrays, attrs: dict[str, Any],
                node_name: str, what: str) -> list[np.ndarray]:
    try:
        results = fn(list(inputs), dict(attrs))
    except AutoclustError:
        raise
    except Exception as exc:
        raise KernelError(f"{op.where(node_name)}: {what} raised {type(exc).__name__}: "
                          f"{exc}") from exc
    if isinstance(results, np.ndarray | np.generic):
        results = [results]
    if not isinstance(results, list | tuple):
        raise KernelError(f"{op.where(node_name)}: {what} must return an array or a list of "
                          f"arrays, got {type(results).__name__}")
    return [np.asarray(r) for r in results]


class CCall:
    """A C kernel bound to one op: call(inputs, outputs) passes their pointers and dims.

    Used with host arrays, and with device arrays (anything with `.data.ptr`, CuPy) by the
    GPU backend's gpu_kernel hook."""

    def __init__(self, op: CustomOp, node_name: str = "", fn: Any = None):
        self.op = op
        self.node_name = node_name
        self.fn = fn if fn is not None else op.c_kernel
        self._key: tuple | None = None
        self._dims: Any = None
        self._ranks: Any = None

    def __call__(self, inputs: Arrays, outputs: Sequence[Any]) -> None:
        tensors = [*inputs, *outputs]
        key = tuple(None if x is None else x.shape for x in tensors)
        if key != self._key:  # a compiled cluster calls with the same shapes every run
            shapes = [() if s is None else s for s in key]
            self._ranks = (ctypes.c_int64 * max(len(shapes), 1))(*[len(s) for s in shapes])
            flat = [d for s in shapes for d in s]
            self._dims = (ctypes.c_int64 * max(len(flat), 1))(*flat)
            self._key = key
        ins = (ctypes.c_void_p * max(len(inputs), 1))(*[_address(x) for x in inputs])
        outs = (ctypes.c_void_p * max(len(outputs), 1))(*[_address(y) for y in outputs])
        code = self.fn(ins, outs, self._dims, self._ranks, len(inputs), len(outputs))
        if code != 0:
            raise KernelError(f"{self.op.where(self.node_name)}: C kernel returned error code "
                              f"{code}")


class HostRunner:
    """Runs a (sub)graph in autoclust's runtime, never in onnxruntime: custom nodes with
    their kernels, any other node with its NumPy reference (as the interpreter does).

    It stands in for an onnxruntime Segment (same `run(inputs, run_options)`) where the
    graph holds custom nodes: a custom node outside every cluster, and the fallback of a
    cluster that could not be compiled."""

    def __init__(self, graph: Graph, name: str):
        self.graph = graph
        self.name = name
        self.input_names = [v.name for v in graph.inputs]
        self.output_names = [v.name for v in graph.outputs]

    def run(self, inputs: list[Any], run_options: Any = None) -> list[np.ndarray]:
        """Outputs in output_names order for inputs in input_names order."""
        env: dict[str, Any] = dict(self.graph.initializers)
        env.update(zip(self.input_names, inputs))
        with np.errstate(all="ignore"):
            for node in self.graph.nodes:
                args = [None if v is None else env[v.name] for v in node.inputs]
                if is_custom(node):
                    op = get(node.domain, node.op)
                    if op is None:
                        raise KernelError(f"custom op {node.qualified_op} (node "
                                          f"{node.name!r}) is no longer registered")
                    outs = run_kernel(op, args, node.attrs, node.name, len(node.outputs))
                else:
                    outs = ops.run_ref(node, args)
                for v, r in zip(node.outputs, outs):
                    env[v.name] = np.asarray(r)
        # Never hand out an input or a constant itself (the caller may write to outputs).
        given = set(self.input_names) | set(self.graph.initializers)
        return [np.array(env[n], copy=True) if n in given else env[n]
                for n in self.output_names]


def _address(x: Any) -> int | None:
    if x is None:
        return None
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            raise KernelError(f"internal: a non-contiguous array reached a C kernel: {x.shape}")
        return x.ctypes.data
    return x.data.ptr  # a device array (CuPy)


def _dense(x: np.ndarray) -> np.ndarray:
    return x if x.flags.c_contiguous else x.copy(order="C")


def _describe(dtypes: Sequence[Any], shapes: Sequence[Any]) -> str:
    return ", ".join("None" if t is None else
                     f"{np.dtype(t).name}{'[?]' if s is None else list(s)}"
                     for t, s in zip(dtypes, shapes))
