"""A stand-in for CuPy (and its NVRTC / cuBLAS bindings) on a machine without a GPU.

It runs the GPU backend's *Python* side for real -- the executable's buffer binding,
memory-plan slots, launch arguments and grid sizes, device-side check flags, the cuBLAS
calls' pointer arithmetic, NVRTC caching, the runtime's moves and the CUDA graph
capture/replay logic -- while the kernels themselves run as their C rendering:

- "NVRTC" returns the CUDA source as the "cubin"; `Module.load` builds the C rendering of
  the same programs (recorded by `install`), whose functions carry the same symbols and
  parameters (plus the emulated grid), and `Function.__call__` calls them with the grid
  and block the executable computed.
- cuBLAS: tests/support/fake_cublas.py (an independent column-major reference; cuBLAS's
  capture rules).

It behaves like the real thing where bugs hide:

- Device arrays (FakeArray) are not NumPy arrays: `np.asarray(x)` raises TypeError as
  CuPy's does; `.get()`, `cupy.asnumpy` copy to the host (and synchronize).
- Streams are asynchronous: work is queued per stream and runs at a synchronization (a
  host read, `synchronize()`), the queues interleaved one item at a time, so two streams
  sharing scratch memory compute wrong answers, as they would on a GPU. The legacy null
  stream orders with every blocking stream; events order streams.
- A stream under capture records its work into the graph and rejects what real capture
  rejects: synchronization, host <-> device copies, allocation (a graph must not point at
  memory allocated during its capture) and work on the legacy stream.
- Kernel arguments are packed as CuPy packs them (Python int: 8 bytes, numpy scalars:
  their size) and checked against the kernel's parameter types in the source: a 4/8-byte
  mismatch raises LaunchError instead of silently misreading, as a GPU would.

Use through `installed` (a pytest fixture body).
"""

from __future__ import annotations

import collections
import ctypes
import re
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from autoclust.backends.gpu import source

from support import fake_cublas, hostsim

__version__ = "14.2.0+fake"
int32, uint8, uint16, float32, float16, float64 = (np.int32, np.uint8, np.uint16, np.float32,
                                                   np.float16, np.float64)
IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to "
            "construct a NumPy array explicitly.")
_C_PARTS: dict[str, Any] = {}  # symbol -> the C Rendered holding it
_LOCK = threading.RLock()      # queues, captures and the draining of work


class LaunchError(RuntimeError):
    """A kernel launch whose arguments do not match the kernel's parameters."""


class CudaError(RuntimeError):
    """What the CUDA runtime would return for an operation the stand-in refuses."""


# ---- streams and the work queues ----------------------------------------------------------

class _Queue:
    """One stream's pending work: (sequence number, fn, dependencies) in order."""

    def __init__(self) -> None:
        self.items: collections.deque = collections.deque()
        self.done = 0   # the last sequence number run
        self.last = 0   # the last sequence number queued


_QUEUES: dict[int, _Queue] = collections.defaultdict(_Queue)
_SEQ = [0]
_CAPTURES: dict[int, list] = {}  # capturing stream -> its recording
_LOCAL = threading.local()       # this thread's stack of current streams
# (array's weakref, its memory): an allocation lives until a drain ends (nothing queued can
# read it any more) with its array gone; a run may drop its input while kernels queued with
# its address still wait, as CuPy's pool allows on one stream
_KEEP: list[tuple[Any, np.ndarray]] = []
_LIVE: dict[int, Any] = {}       # allocation address -> weakref of its array


class _Stream:
    made = 0

    def __init__(self, non_blocking: bool = False, null: bool = False, ptds: bool = False):
        if null:
            self.ptr = 0
        else:
            _Stream.made += 1
            self.ptr = 0x5000 + _Stream.made
        self.non_blocking = non_blocking

    def __enter__(self) -> Any:
        _stack().append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _stack().pop()

    def use(self) -> _Stream:
        _stack()[:] = [self]
        return self

    def begin_capture(self, mode: Any = None) -> None:
        if self.ptr == 0:
            raise RuntimeError("cannot capture on the default (legacy) stream")
        with _LOCK:
            _CAPTURES[self.ptr] = []

    def end_capture(self) -> _Graph:
        with _LOCK:
            return _Graph(_CAPTURES.pop(self.ptr))

    def is_capturing(self) -> bool:
        return self.ptr in _CAPTURES

    def synchronize(self) -> None:
        _refuse_sync(f"stream 0x{self.ptr:x}.synchronize()", self)
        drain()

    def record(self, event: _Event | None = None) -> _Event:
        event = event or _Event()
        event.record(self)
        return event

    def wait_event(self, event: _Event) -> None:
        if event.at is not None:
            _enqueue(self, lambda: None, [event.at])


_NULL = _Stream(null=True)


def _stack() -> list:
    stack = getattr(_LOCAL, "stack", None)
    if stack is None:
        stack = _LOCAL.stack = []
    return stack


def current_stream() -> _Stream:
    stack = _stack()
    return stack[-1] if stack else _NULL


def _capturing() -> bool:
    return bool(_CAPTURES)


def _refuse_sync(what: str, stream: _Stream | None = None) -> None:
    """Synchronizing while a stream captures invalidates the capture (cudaErrorStream
    CaptureUnsupported); CuPy refuses host <-> device copies then (memory.pyx)."""
    if _capturing():
        raise CudaError(f"cudaErrorStreamCaptureUnsupported: {what} while stream "
                        f"0x{next(iter(_CAPTURES)):x} captures")


def _enqueue(stream: _Stream, fn: Callable[[], None], deps: list | None = None) -> None:
    with _LOCK:
        deps = list(deps or [])
        if stream.ptr == 0:  # the legacy stream waits for every blocking stream
            deps += [(p, q.last) for p, q in _QUEUES.items() if p != 0 and q.last > q.done
                     and not _NONBLOCKING.get(p, False)]
        elif not stream.non_blocking and _QUEUES[0].last > _QUEUES[0].done:
            deps.append((0, _QUEUES[0].last))
        _SEQ[0] += 1
        q = _QUEUES[stream.ptr]
        q.items.append((_SEQ[0], fn, deps))
        q.last = _SEQ[0]
        _NONBLOCKING[stream.ptr] = stream.non_blocking


_NONBLOCKING: dict[int, bool] = {}


def later(fn: Callable[[], None], what: str = "work") -> None:
    """Queue fn on the current stream, or record it into that stream's capture."""
    s = current_stream()
    with _LOCK:
        rec = _CAPTURES.get(s.ptr)
        if rec is not None:
            rec.append(fn)
            return
        if _capturing() and s.ptr == 0:
            raise CudaError(f"cudaErrorStreamCaptureImplicit: {what} on the legacy stream while "
                            f"stream 0x{next(iter(_CAPTURES)):x} captures")
        _enqueue(s, fn)


def _ready(deps: list) -> bool:
    return all(_QUEUES[p].done >= seq for p, seq in deps)


def drain() -> None:
    """Run every queued item, the streams interleaved one item at a time (as streams
    overlap on a GPU); an item waits for its dependencies."""
    with _LOCK:
        while True:
            pending = [(p, q) for p, q in sorted(_QUEUES.items()) if q.items]
            if not pending:
                break
            progressed = False
            for _, q in pending:
                seq, fn, deps = q.items[0]
                if not _ready(deps):
                    continue
                q.items.popleft()
                fn()
                q.done = seq
                progressed = True
            if not progressed:
                raise CudaError("stand-in CuPy: streams wait on each other (deadlock)")
        _KEEP[:] = [(ref, a) for ref, a in _KEEP if ref() is not None]


class _Event:
    def __init__(self, block: bool = False, disable_timing: bool = False,
                 interprocess: bool = False):
        self.at: tuple[int, int] | None = None
        self.t = 0.0

    def record(self, stream: _Stream | None = None) -> None:
        import time
        stream = stream or current_stream()

        def mark() -> None:
            self.t = time.perf_counter()

        if stream.ptr in _CAPTURES:
            _CAPTURES[stream.ptr].append(mark)
            return
        _enqueue(stream, mark)
        self.at = (stream.ptr, _QUEUES[stream.ptr].last)

    def synchronize(self) -> None:
        _refuse_sync("event.synchronize()")
        drain()

    @property
    def done(self) -> bool:
        return self.at is None or _ready([self.at])


class _Graph:
    def __init__(self, thunks: list):
        self.thunks = thunks

    def launch(self, stream: _Stream | None = None) -> None:
        stream = stream or current_stream()
        for t in self.thunks:
            _enqueue(stream, t)


# ---- arrays -------------------------------------------------------------------------------

class _Ptr:
    def __init__(self, ptr: int):
        self.ptr = ptr


def _alloc(a: np.ndarray) -> FakeArray:
    """A new device allocation holding host array a's layout (its data is not copied)."""
    if _capturing():
        raise CudaError("stand-in CuPy: allocation while a stream captures (the graph would "
                        "point at memory its capture allocated)")
    out = FakeArray(a)
    ref = weakref.ref(out)
    with _LOCK:
        _KEEP.append((ref, a))
        _LIVE[out.data.ptr] = ref
    return out


def alive(ptr: int) -> bool:
    """Whether the allocation at `ptr` is still held by its owner (a device pointer a
    graph or a handle keeps must not outlive the array it came from)."""
    ref = _LIVE.get(ptr)
    return ref is not None and ref() is not None


def _unwrap(x: Any) -> Any:
    return x._a if isinstance(x, FakeArray) else x


class FakeArray:
    """A device array: shape, dtype, views and `.data.ptr`; no implicit host access."""

    __array_priority__ = 100

    def __init__(self, a: np.ndarray):
        self._a = a

    # -- metadata --
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    ndim = property(lambda self: self._a.ndim)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)

    def __len__(self) -> int:
        return len(self._a)

    @property
    def data(self) -> _Ptr:  # CuPy: a MemoryPointer
        return _Ptr(self._a.__array_interface__["data"][0])

    @property
    def __cuda_array_interface__(self) -> dict:
        iface = dict(self._a.__array_interface__)
        iface["version"] = 3
        return iface

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError(IMPLICIT)

    def __repr__(self) -> str:
        return f"FakeArray(shape={self.shape}, dtype={self.dtype})"

    # -- host copies --
    def get(self, stream: Any = None) -> np.ndarray:
        _refuse_sync("a device-to-host copy (.get())")
        drain()
        return np.array(self._a, copy=True)

    def __float__(self) -> float:
        return float(self.get())

    def __int__(self) -> int:
        return int(self.get())

    def __bool__(self) -> bool:
        return bool(self.get())

    # -- views (no data moves) --
    def reshape(self, *shape: Any) -> FakeArray:
        if not self._a.flags.c_contiguous:
            raise NotImplementedError("stand-in CuPy: reshape of a strided array copies")
        return FakeArray(self._a.reshape(*shape))

    def view(self, dtype: Any) -> FakeArray:
        return FakeArray(self._a.view(dtype))

    def __getitem__(self, key: Any) -> FakeArray:
        out = self._a[key]
        if not np.shares_memory(out, self._a):
            raise NotImplementedError("stand-in CuPy: advanced indexing copies")
        return FakeArray(out)

    # -- queued work --
    def __setitem__(self, key: Any, value: Any) -> None:
        value = _device_operand(value)
        later(lambda: self._a.__setitem__(key, _unwrap(value)), "a copy")

    def fill(self, value: Any) -> None:
        later(lambda: self._a.fill(value), "fill")

    def copy(self) -> FakeArray:
        out = _alloc(np.empty_like(self._a, order="C"))
        later(lambda: np.copyto(out._a, self._a), "a copy")
        return out

    def astype(self, dtype: Any, copy: bool = True) -> FakeArray:
        out = _alloc(np.empty(self.shape, dtype))
        later(lambda: np.copyto(out._a, self._a, casting="unsafe"), "astype")
        return out

    # -- ufuncs run on the device (NEP 13, as CuPy's arrays do) --
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if method != "__call__" or "out" in kwargs:
            return NotImplemented
        args = [_device_operand(x) for x in inputs]
        shape = np.broadcast_shapes(*(np.shape(_unwrap(x)) for x in args))
        dtype = ufunc(*[np.zeros((), _unwrap(x).dtype if isinstance(x, FakeArray)
                                 else np.asarray(x).dtype) for x in args]).dtype
        out = _alloc(np.empty(shape, dtype))
        later(lambda: ufunc(*[_unwrap(x) for x in args], out=out._a, **kwargs), ufunc.__name__)
        return out

    def __neg__(self) -> FakeArray:
        return np.negative(self)

    __add__ = lambda self, o: np.add(self, o)
    __radd__ = lambda self, o: np.add(o, self)
    __sub__ = lambda self, o: np.subtract(self, o)
    __rsub__ = lambda self, o: np.subtract(o, self)
    __mul__ = lambda self, o: np.multiply(self, o)
    __rmul__ = lambda self, o: np.multiply(o, self)
    __truediv__ = lambda self, o: np.divide(self, o)
    __rtruediv__ = lambda self, o: np.divide(o, self)


def _device_operand(x: Any) -> Any:
    """A kernel operand: device arrays and Python/NumPy scalars; a host array is refused
    (CuPy's kernels take no NumPy arrays beyond size one)."""
    if isinstance(x, np.ndarray) and x.size != 1:
        raise TypeError(f"Unsupported type {type(x)}")
    return x


ndarray = FakeArray


def empty(shape: Any, dtype: Any = np.float32) -> FakeArray:
    return _alloc(np.empty(shape, dtype))


def zeros(shape: Any, dtype: Any = np.float32) -> FakeArray:
    out = _alloc(np.empty(shape, dtype))
    later(lambda: out._a.fill(0), "memset")
    return out


def ones(shape: Any, dtype: Any = np.float32) -> FakeArray:
    out = _alloc(np.empty(shape, dtype))
    later(lambda: out._a.fill(1), "memset")
    return out


def empty_like(a: Any) -> FakeArray:
    return empty(a.shape, a.dtype)


def asarray(a: Any, dtype: Any = None) -> FakeArray:
    """Device arrays as they are; host data copied over (a host-to-device transfer)."""
    if isinstance(a, FakeArray):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    if _capturing():
        raise RuntimeError("the current stream is capturing, so H2D transfers are disallowed")
    host = np.array(a, dtype=dtype, copy=True, order="C")
    return _alloc(host)


def asnumpy(a: Any, stream: Any = None) -> np.ndarray:
    return a.get() if isinstance(a, FakeArray) else np.asarray(a)


def ascontiguousarray(a: Any) -> FakeArray:
    return a if a.flags.c_contiguous else a.copy()


def from_dlpack(a: Any) -> FakeArray:
    return asarray(np.from_dlpack(a))


def copyto(dst: FakeArray, src: Any) -> None:
    src = src if isinstance(src, FakeArray) else _device_operand(src)
    later(lambda: np.copyto(dst._a, _unwrap(src), casting="unsafe"), "copyto")


def multiply(a: Any, b: Any, out: FakeArray) -> None:
    later(lambda: np.multiply(_unwrap(a), _unwrap(b), out=out._a), "multiply")


def matmul(a: FakeArray, b: FakeArray) -> FakeArray:
    shape = np.matmul(np.empty(a.shape, a.dtype), np.empty(b.shape, b.dtype)).shape
    out = _alloc(np.empty(shape, np.result_type(a.dtype, b.dtype)))
    later(lambda: np.matmul(a._a, b._a, out=out._a), "matmul")
    return out


def einsum(eq: str, *ops: FakeArray) -> FakeArray:
    probe = np.einsum(eq, *[np.zeros(o.shape, o.dtype) for o in ops])
    out = _alloc(np.empty(probe.shape, probe.dtype))
    later(lambda: np.copyto(out._a, np.einsum(eq, *[o._a for o in ops])), "einsum")
    return out


class _Pool:
    def free_all_blocks(self) -> None:
        pass

    def used_bytes(self) -> int:
        return 0


def get_default_memory_pool() -> _Pool:
    return _Pool()


# ---- kernels: modules, functions and argument packing ------------------------------------

_SIGNATURE = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\([\d, ]+\) )?'
                        r"(\w+)\(([^)]*)\)")
# C parameter type -> (bytes, kind): what CUDA reads from the packed argument
_PARAM = {"long long": (8, "i"), "unsigned long long": (8, "i"), "int": (4, "i"),
          "unsigned": (4, "i"), "float": (4, "f"), "double": (8, "f")}
_CTYPE = {"long long": ctypes.c_longlong, "unsigned long long": ctypes.c_ulonglong,
          "int": ctypes.c_int, "unsigned": ctypes.c_uint, "float": ctypes.c_float,
          "double": ctypes.c_double}


def parameters(cuda_source: str) -> dict[str, list[str]]:
    """Kernel symbol -> its parameters' C types ("pointer" for any pointer)."""
    out = {}
    for name, params in _SIGNATURE.findall(cuda_source):
        types_ = []
        for p in params.split(","):
            words = [w for w in p.replace("*", " * ").split() if w not in ("const",
                                                                          "__restrict__")]
            types_.append("pointer" if "*" in words else " ".join(words[:-1]))
        out[name] = types_
    return out


def packed(arg: Any) -> tuple[int, str]:
    """(bytes, kind) of an argument as CuPy packs it (cupy/_core/_scalar.pyx: a Python int
    is int64, a float float64, a bool one byte; NumPy scalars keep their dtype)."""
    if isinstance(arg, FakeArray):
        return 8, "p"
    if isinstance(arg, bool):
        return 1, "b"
    if isinstance(arg, int):
        return 8, "i"
    if isinstance(arg, float):
        return 8, "f"
    if isinstance(arg, np.generic):
        kind = {"i": "i", "u": "i", "f": "f", "b": "b"}[arg.dtype.kind]
        return arg.dtype.itemsize, kind
    raise TypeError(f"Unsupported type {type(arg)}")


class _Function:
    def __init__(self, lib: ctypes.CDLL, symbol: str, params: list[str]):
        self.fn = getattr(lib, symbol)
        self.symbol = symbol
        self.params = params

    def _convert(self, i: int, arg: Any) -> Any:
        decl = self.params[i]
        size, kind = packed(arg)
        want = (8, "p") if decl == "pointer" else _PARAM[decl]
        # a pointer is 8 bytes of integer: CuPy passes `.data.ptr` ints as int64
        ok = (size, kind) == want or (decl == "pointer" and (size, kind) == (8, "i"))
        if not ok:
            raise LaunchError(f"kernel {self.symbol} parameter {i} is '{decl}' ({want[0]} "
                              f"bytes), the argument {arg!r} packs {size} bytes ({kind})")
        if decl == "pointer":
            return ctypes.c_void_p(arg.data.ptr if isinstance(arg, FakeArray) else int(arg))
        return _CTYPE[decl](arg.item() if isinstance(arg, np.generic) else arg)

    def __call__(self, grid: tuple, block: tuple, args: list | tuple, shared_mem: int = 0,
                 stream: Any = None) -> None:
        if len(args) != len(self.params):
            raise LaunchError(f"kernel {self.symbol} takes {len(self.params)} arguments, got "
                              f"{len(args)}")
        cargs = [self._convert(i, a) for i, a in enumerate(args)]
        cargs += [ctypes.c_uint(grid[0]), ctypes.c_uint(block[0])]
        if stream is not None:
            with stream:
                later(lambda: self.fn(*cargs), f"kernel {self.symbol}")
        else:
            later(lambda: self.fn(*cargs), f"kernel {self.symbol}")


class _Module:
    def load(self, cubin: bytes) -> None:
        text = cubin.decode()
        parts = {id(r): r for s, r in _C_PARTS.items() if s in text}
        self.lib = hostsim.build(source.module_source(list(parts.values())))
        self.params = parameters(text)

    def get_function(self, name: str) -> _Function:
        return _Function(self.lib, name, self.params[name])


class _Device:
    id = 0
    compute_capability = "90"

    def __init__(self, device: int = 0):
        self.id = device

    @property
    def attributes(self) -> dict:
        return {"MultiProcessorCount": 4}

    @property
    def mem_info(self) -> tuple[int, int]:
        return (79 << 30, 80 << 30)

    def synchronize(self) -> None:
        _refuse_sync("Device.synchronize()")
        drain()

    def use(self) -> None:
        pass


def _properties(i: int) -> dict:
    return {"name": b"FakeGPU", "major": 9, "minor": 0, "totalGlobalMem": 80 << 30,
            "multiProcessorCount": 4}


def _cuda() -> types.SimpleNamespace:
    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1, runtimeGetVersion=lambda: 13000,
        driverGetVersion=lambda: 13000, getDeviceProperties=_properties,
        deviceSynchronize=lambda: _Device().synchronize(), is_hip=False)
    return types.SimpleNamespace(
        Device=_Device, Stream=_Stream, Event=_Event, runtime=runtime,
        get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3,
        function=types.SimpleNamespace(Module=_Module),
        get_current_stream=current_stream,
        device=types.SimpleNamespace(get_cublas_handle=lambda: 1))


cuda = _cuda()
cuda.Stream.null = _NULL


# ---- cupy_backends.cuda.libs --------------------------------------------------------------

def _nvrtc() -> types.ModuleType:
    m = types.ModuleType("cupy_backends.cuda.libs.nvrtc")
    programs: dict[int, str] = {}
    m.getVersion = lambda: (13, 0)

    def create(src: str, name: str, headers: Any, include_names: Any) -> int:
        programs[len(programs) + 1] = src
        return len(programs)

    m.createProgram = create
    m.compileProgram = lambda prog, options: None
    m.getCUBIN = lambda prog: programs[prog].encode()
    m.getPTX = lambda prog: ("// fake ptx\n" + programs[prog]).encode()
    m.getProgramLog = lambda prog: ""
    m.destroyProgram = lambda prog: None
    return m


def install(monkeypatch: Any) -> None:
    """Make `import cupy` (and its bindings) load this module; record C renderings; let
    blas.py's loader find the stand-in cuBLAS (through a stand-in cuda-pathfinder)."""
    me = sys.modules[__name__]
    libs = types.ModuleType("cupy_backends.cuda.libs")
    libs.nvrtc, libs.cublas = _nvrtc(), fake_cublas.wrapper_module(later)
    for name, mod in (("cupy", me), ("cupy_backends", types.ModuleType("cupy_backends")),
                      ("cupy_backends.cuda", types.ModuleType("cupy_backends.cuda")),
                      ("cupy_backends.cuda.libs", libs),
                      ("cupy_backends.cuda.libs.nvrtc", libs.nvrtc),
                      ("cupy_backends.cuda.libs.cublas", libs.cublas),
                      ("cuda", types.ModuleType("cuda")),
                      ("cuda.pathfinder", fake_cublas.pathfinder_module())):
        monkeypatch.setitem(sys.modules, name, mod)
    real = source.render_program

    def recording(program: Any, target: str, choose_launch: Any = source.choose,
                  mma_attention: bool = False) -> Any:
        if target == "cuda":
            c = real(program, "c", choose_launch, mma_attention)
            for sym in list(c.bodies):
                _C_PARTS[sym] = c
            for sym in c.checks.values():
                _C_PARTS.setdefault(sym, c)
        return real(program, target, choose_launch, mma_attention)

    monkeypatch.setattr(source, "render_program", recording)
    from autoclust.backends.gpu import blas
    monkeypatch.setattr(blas, "_open", fake_cublas.open_library(later, current_stream,
                                                                _CAPTURES, alive))


def installed(monkeypatch: Any) -> Iterator[None]:
    """install(), with the GPU backend's cached imports and compiled modules forgotten
    before and after: the body of a pytest fixture (`yield from fake_cupy.installed(mp)`)."""
    from autoclust.backends.gpu import blas, blaslt, device, nvrtc
    install(monkeypatch)
    for cached in (device._import, device.info, blas.get, blaslt.get):
        cached.cache_clear()
    yield
    drain()
    for cached in (device._import, device.info, blas.get, blaslt.get):
        cached.cache_clear()
    nvrtc._MODULES.clear()
