"""Trace NumPy functions into an autoclust Graph (the front end of autoclust.jit/trace).

    graph, out_tree = trace_graph(fn, [("x", x)], lambda x: fn(x))

A Tracer stands for an array while the function runs: NumPy hands every ufunc call to
`Tracer.__array_ufunc__` (importers/numpy/ufuncs.py) and every other NumPy function to
`Tracer.__array_function__` (importers/numpy/functions.py); operators, methods and
indexing go the same way. Each records op-table ops through a Builder, with NumPy's
semantics made explicit: NumPy's own type resolution picks each result dtype (Python
scalars are weak, NEP 50: `0.5 * float32_array` stays float32), operands are cast to it,
and dtypes onnxruntime has no kernels for compute in a wider type and are cast back
(float16 in float32, rounding after every op as NumPy does; int8/16, uint8/16 in int32).
Every recorded result is checked against the dtype and shape NumPy gives.

What cannot be traced raises TraceError naming the NumPy function and the argument types;
a Python branch on a traced value (`if x.sum() > 0:`) raises TraceError too: the value is
not known while tracing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from autoclust.importers.builder import Builder, Operand

from autoclust.errors import InvalidInputError, TraceError

# Dtypes onnxruntime lacks kernels for, and the type their arithmetic runs in.
WIDE = {np.dtype(k): np.dtype(v) for k, v in (
    ("float16", "float32"), ("int8", "int32"), ("int16", "int32"), ("uint8", "int32"),
    ("uint16", "int32"), ("uint32", "int64"), ("bool", "int32"))}
TRACEABLE_KINDS = "biuf"
# How traced arrays reach their lowerings: NumPy function -> its lowering, and the
# lowerings of ufuncs, indexing and astype. The package's __init__ fills both from the
# modules beside this one (they import this module, so it cannot import them).
FUNCTIONS: dict[Callable[..., Any], Callable[..., Any]] = {}
HOOKS: dict[str, Callable[..., Any]] = {}


def describe(x: Any) -> str:
    """A short type description of one argument, for error messages."""
    if isinstance(x, Tracer):
        return f"traced {x.operand.value.type_str()}"
    if isinstance(x, np.ndarray):
        return f"ndarray {x.dtype}{list(x.shape)}"
    if isinstance(x, np.generic):
        return f"{type(x).__name__} scalar"
    if isinstance(x, list | tuple):
        inner = ", ".join(describe(v) for v in x[:4]) + (", ..." if len(x) > 4 else "")
        return f"{type(x).__name__}[{inner}]"
    return type(x).__name__


def describe_call(name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    parts = [describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def unsupported(name: str, args: Sequence[Any], kwargs: dict[str, Any], why: str = ""
                ) -> TraceError:
    """The TraceError for a NumPy call the tracer cannot record."""
    why = f": {why}" if why else ""
    return TraceError(f"autoclust cannot trace {describe_call(name, args, kwargs)}{why}")


class TraceContext:
    """One trace: its Builder, and whether it is still running (leaked tracers fail)."""

    def __init__(self, name: str):
        self.name = name
        self.builder = Builder(name)
        self.active = True

    def parameter(self, name: str, array: np.ndarray) -> Tracer:
        if array.dtype.kind not in TRACEABLE_KINDS or array.dtype.itemsize > 8:
            raise TraceError(f"{self.name}: argument {name!r} has dtype {array.dtype}; traced "
                             "arrays must be bool, int, uint or float (16-64 bits)")
        t = Tracer(self, self.builder.parameter(name, array.dtype, array.shape))
        t.is_argument_view = True
        return t

    def own(self, t: Tracer) -> Operand:
        """t's operand, after checking it belongs to this trace and the trace is running."""
        if t.ctx is not self or not self.active:
            where = "a finished trace" if not t.ctx.active else f"another trace ({t.ctx.name})"
            raise TraceError(f"{t!r} comes from {where}: a traced value escaped its function "
                             "(stored in a global or a closure?)")
        return t.operand

    def operand(self, x: Any, dtype: np.dtype | None = None) -> Operand:
        """x as an Operand, cast to `dtype` when given (constants are made in it)."""
        if isinstance(x, Tracer):
            op = self.own(x)
            return op if dtype is None or op.dtype == dtype else self.cast(op, dtype)
        array = np.asarray(x) if dtype is None else np.asarray(x, dtype=dtype)
        if array.dtype.kind not in TRACEABLE_KINDS or array.dtype.itemsize > 8:
            raise TraceError(f"{self.name}: cannot use a {describe(x)} (dtype {array.dtype}) "
                             "in a traced computation")
        return self.builder.constant(array)

    def cast(self, op: Operand, dtype: np.dtype) -> Operand:
        dtype = np.dtype(dtype)
        return op if op.dtype == dtype else self.builder.Cast(op, to=dtype)

    def wrap(self, op: Operand, dtype: np.dtype, shape: tuple, what: str) -> Tracer:
        """A Tracer for op, cast to `dtype`; `shape` is NumPy's and must match."""
        op = self.cast(op, dtype)
        if tuple(op.shape or ()) != tuple(shape) or op.shape is None:
            raise TraceError(f"internal error tracing {what}: NumPy gives {np.dtype(dtype)}"
                             f"{list(shape)}, the graph {op.value.type_str()}")
        return Tracer(self, op)


def context_of(args: Sequence[Any]) -> TraceContext:
    """The trace of the first Tracer among (possibly nested) arguments."""
    for a in args:
        if isinstance(a, Tracer):
            return a.ctx
        if isinstance(a, list | tuple):
            for b in a:
                if isinstance(b, Tracer):
                    return b.ctx
    raise TraceError("no traced array among the arguments")


def _concrete(what: str) -> Callable[..., Any]:
    def refuse(self: Tracer, *args: Any) -> Any:
        raise TraceError(
            f"{what} of a traced array {self.operand.value.type_str()} in "
            f"{self.ctx.name}: its value is not known while tracing (data-dependent Python "
            "control flow such as `if x.sum() > 0:`). Use np.where(...) for a data-dependent "
            "choice, or pass the value as a static argument (static_argnames=...)")
    return refuse


def _ufunc_method(ufunc: np.ufunc, reverse: bool = False) -> Callable[..., Any]:
    if reverse:
        return lambda self, other: ufunc(other, self)
    return lambda self, other: ufunc(self, other)


def view_of(source: Any, result: Tracer) -> Tracer:
    """Mark `result` as a NumPy view of `source` (reshape, transpose, slicing, ...): an
    in-place update of it would change the caller's array in NumPy."""
    if isinstance(source, Tracer) and source.is_argument_view:
        result.is_argument_view = True
    return result


def _inplace(ufunc: np.ufunc) -> Callable[..., Any]:
    """x op= y: a new traced value under x's name, with NumPy's in-place casting rule."""
    def method(self: Tracer, other: Any) -> Any:
        if self.is_argument_view:
            raise TraceError(
                f"np.{ufunc.__name__} in place on {self!r}, an argument of {self.ctx.name} or "
                "a view of one: NumPy would change the caller's array, a traced function "
                "cannot. Write `x = x + y` (a new array) instead")
        r = ufunc(self, other)
        if r.shape != self.shape:
            raise InvalidInputError(f"non-broadcastable output operand with shape "
                                    f"{self.shape} doesn't match the broadcast shape {r.shape}")
        if r.dtype != self.dtype and not np.can_cast(r.dtype, self.dtype, "same_kind"):
            raise TraceError(f"Cannot cast ufunc {ufunc.__name__!r} output from {r.dtype} to "
                             f"{self.dtype} with casting rule 'same_kind'")
        return r if r.dtype == self.dtype else r.astype(self.dtype)
    return method


class Tracer:
    """A traced array: shape and dtype are known, its values are not."""

    __slots__ = ("ctx", "is_argument_view", "operand")
    __array_priority__ = 1000

    def __init__(self, ctx: TraceContext, operand: Operand):
        self.ctx = ctx
        self.operand = operand
        self.is_argument_view = False  # an argument, or a view of one (see view_of)

    # ---- what is known while tracing ------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.operand.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.operand.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return f"Tracer({self.operand.value.type_str()})"

    # ---- values are not known -------------------------------------------------------
    __bool__ = _concrete("bool()")
    __int__ = _concrete("int()")
    __float__ = _concrete("float()")
    __complex__ = _concrete("complex()")
    __index__ = _concrete("using as an index")
    item = _concrete("item()")
    tolist = _concrete("tolist()")

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TraceError(f"cannot turn a traced array {self.operand.value.type_str()} into a "
                         f"NumPy array in {self.ctx.name} (np.asarray/np.array of a traced "
                         "value, or a NumPy function that does so internally); its values "
                         "are not known while tracing. Use x.astype(dtype) to convert; to "
                         "index a NumPy array with traced indices, pass that array as an "
                         "argument (traced arrays take traced indices)")

    def __setitem__(self, key: Any, value: Any) -> None:
        raise TraceError(f"traced arrays are immutable ({self!r}[...] = ...); build a new "
                         "array instead, e.g. with np.where(mask, value, x) or "
                         "np.concatenate")

    # ---- NumPy's protocols ----------------------------------------------------------
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any
                        ) -> Any:
        return HOOKS["ufunc"](context_of(inputs), ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Callable[..., Any], types: Any, args: Any,
                           kwargs: Any) -> Any:
        impl = FUNCTIONS.get(func)
        if impl is None:
            name = f"np.{getattr(func, '__name__', func)}"
            raise unsupported(name, args, kwargs, "this NumPy function is not supported")
        return impl(*args, **kwargs)

    # ---- operators (through the ufuncs, as ndarray's) -------------------------------
    __add__, __radd__ = _ufunc_method(np.add), _ufunc_method(np.add, True)
    __sub__, __rsub__ = _ufunc_method(np.subtract), _ufunc_method(np.subtract, True)
    __mul__, __rmul__ = _ufunc_method(np.multiply), _ufunc_method(np.multiply, True)
    __truediv__ = _ufunc_method(np.true_divide)
    __rtruediv__ = _ufunc_method(np.true_divide, True)
    __floordiv__ = _ufunc_method(np.floor_divide)
    __rfloordiv__ = _ufunc_method(np.floor_divide, True)
    __mod__, __rmod__ = _ufunc_method(np.remainder), _ufunc_method(np.remainder, True)
    __pow__, __rpow__ = _ufunc_method(np.power), _ufunc_method(np.power, True)
    __matmul__, __rmatmul__ = _ufunc_method(np.matmul), _ufunc_method(np.matmul, True)
    __and__, __rand__ = _ufunc_method(np.bitwise_and), _ufunc_method(np.bitwise_and, True)
    __or__, __ror__ = _ufunc_method(np.bitwise_or), _ufunc_method(np.bitwise_or, True)
    __xor__, __rxor__ = _ufunc_method(np.bitwise_xor), _ufunc_method(np.bitwise_xor, True)
    __lt__, __le__ = _ufunc_method(np.less), _ufunc_method(np.less_equal)
    __gt__, __ge__ = _ufunc_method(np.greater), _ufunc_method(np.greater_equal)
    __eq__ = _ufunc_method(np.equal)  # type: ignore[assignment]
    __ne__ = _ufunc_method(np.not_equal)  # type: ignore[assignment]
    __hash__ = object.__hash__

    __iadd__, __isub__ = _inplace(np.add), _inplace(np.subtract)
    __imul__, __itruediv__ = _inplace(np.multiply), _inplace(np.true_divide)
    __ifloordiv__, __imod__ = _inplace(np.floor_divide), _inplace(np.remainder)
    __ipow__, __imatmul__ = _inplace(np.power), _inplace(np.matmul)
    __iand__, __ior__ = _inplace(np.bitwise_and), _inplace(np.bitwise_or)
    __ixor__ = _inplace(np.bitwise_xor)

    def __divmod__(self, other: Any) -> Any:
        return np.divmod(self, other)

    def __rdivmod__(self, other: Any) -> Any:
        return np.divmod(other, self)

    def __neg__(self) -> Any:
        return np.negative(self)

    def __pos__(self) -> Any:
        return np.positive(self)

    def __abs__(self) -> Any:
        return np.absolute(self)

    def __invert__(self) -> Any:
        return np.invert(self)

    def __getitem__(self, key: Any) -> Tracer:
        return HOOKS["getitem"](self, key)

    # ---- ndarray methods ------------------------------------------------------------
    @property
    def T(self) -> Tracer:
        return np.transpose(self)

    @property
    def mT(self) -> Tracer:
        if self.ndim < 2:
            raise TraceError(f"mT needs at least 2 dimensions, {self!r} has {self.ndim}")
        return np.swapaxes(self, -1, -2)

    def astype(self, dtype: Any, order: str = "K", casting: str = "unsafe", subok: bool = True,
               copy: bool = True) -> Tracer:
        return HOOKS["astype"](self, dtype, casting=casting)

    def reshape(self, *shape: Any, order: str = "C", copy: Any = None) -> Tracer:
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        return np.reshape(self, shape, order=order)

    def transpose(self, *axes: Any) -> Tracer:
        if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], tuple | list)):
            axes = axes[0]
        return np.transpose(self, axes or None)

    def flatten(self, order: str = "C") -> Tracer:
        return np.ravel(self, order=order)

    def ravel(self, order: str = "C") -> Tracer:
        return np.ravel(self, order=order)

    def copy(self, order: str = "C") -> Tracer:
        return np.copy(self, order=order)

    def view(self, *args: Any, **kwargs: Any) -> Any:
        raise unsupported("ndarray.view", args, kwargs, "views reinterpret memory")


def _forward(name: str) -> Callable[..., Any]:
    func = getattr(np, name)

    def method(self: Tracer, *args: Any, **kwargs: Any) -> Any:
        return func(self, *args, **kwargs)
    method.__name__ = name
    method.__doc__ = f"As ndarray.{name} (np.{name} on the traced array)."
    return method


for _name in ("sum", "mean", "max", "min", "prod", "any", "all", "argmax", "argmin", "var",
              "std", "cumsum", "clip", "squeeze", "swapaxes", "round", "dot", "take",
              "repeat", "nonzero", "sort", "argsort"):
    setattr(Tracer, _name, _forward(_name))


# ---- tracing a whole function -------------------------------------------------------------

def trace_graph(name: str, arrays: Sequence[tuple[str, np.ndarray]],
                call: Callable[[list[Tracer]], Any],
                flatten: Callable[[Any], tuple[list[Any], Any]]) -> tuple[Builder, Any]:
    """Run `call` on Tracers for `arrays` (name, example array) and build the graph.

    `flatten` splits the result into leaves and a tree: Tracers and arrays become graph
    outputs (in order), other leaves stay in the tree. Returns (builder, tree) where the
    tree's array leaves are replaced by their output index."""
    ctx = TraceContext(name)
    try:
        tracers = [ctx.parameter(n, a) for n, a in arrays]
        result = call(tracers)
        leaves, tree = flatten(result)
        outputs, slots = [], []
        for leaf in leaves:
            if isinstance(leaf, Tracer):
                outputs.append(ctx.own(leaf))
            elif isinstance(leaf, np.ndarray):
                outputs.append(ctx.operand(leaf))
            else:
                slots.append(leaf)
                continue
            slots.append(OutputSlot(len(outputs) - 1))
        if outputs:
            ctx.builder.build(outputs)
        return ctx.builder, (tree, slots)
    finally:
        ctx.active = False


class OutputSlot:
    """Marks where graph output `index` goes in the result tree."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index
