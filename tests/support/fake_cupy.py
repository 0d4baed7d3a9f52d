"""A stand-in for CuPy (and its NVRTC / cuBLAS bindings) on a machine without a GPU.

It runs the GPU backend's *Python* side for real -- the executable's buffer binding,
memory-plan slots, launch arguments and grid sizes, device-side check flags, the cuBLAS
calls' pointer arithmetic, NVRTC caching, the runtime's moves and the CUDA graph
capture/replay logic -- while the kernels themselves run as their C rendering:

- "NVRTC" returns the CUDA source as the "cubin"; `Module.load` builds the C rendering of
  the same programs (recorded by `install`), whose functions carry the same symbols and
  parameters (plus the emulated grid), and `Function.__call__` calls them with the grid
  and block the executable computed.
- cuBLAS's gemmStridedBatchedEx runs backends/gpu/gemm.emulate on the raw pointers. Through
  CuPy's wrapper it refuses to run while a stream captures, as CuPy 14's does; through
  FakeLibcublas (what backends/gpu/blas.py loads) it is captured, provided the handle is
  on the capturing stream with a workspace of its own, as real cuBLAS requires.
- Arrays are NumPy arrays of class FakeArray (with `.data.ptr`, `.get()` and the CUDA array
  interface); during a stream capture, launches, fills and copies are recorded into the
  "graph" instead of run, so a replay really re-executes them.

Use through the `fake_cupy` fixture of tests/gpu/test_gpu_fake.py.
"""

from __future__ import annotations

import ctypes
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
from autoclust.backends.gpu import gemm, source

from support import hostsim

_CAPTURE: list[list] = []   # the recording of the stream that captures, if any
_C_PARTS: dict[str, Any] = {}  # symbol -> the C Rendered holding it
DTYPES = {0: np.float32, 1: np.float64, 2: np.float16}
__version__ = "14.2.0+fake"
int32, uint8, float32, float16, float64 = np.int32, np.uint8, np.float32, np.float16, np.float64


def _later(fn: Any) -> None:
    """Run fn now, or record it into the graph being captured."""
    if _CAPTURE:
        _CAPTURE[-1].append(fn)
    else:
        fn()


class _Ptr:
    def __init__(self, ptr: int):
        self.ptr = ptr


class FakeArray(np.ndarray):
    """A NumPy array standing in for a device array."""

    @property
    def data(self) -> _Ptr:  # CuPy: a MemoryPointer
        return _Ptr(self.__array_interface__["data"][0])

    @property
    def __cuda_array_interface__(self) -> dict:
        return self.__array_interface__

    def get(self) -> np.ndarray:
        return np.array(self, copy=True).view(np.ndarray)

    def fill(self, value: Any) -> None:
        _later(lambda: np.ndarray.fill(self, value))


ndarray = FakeArray


def _fake(a: np.ndarray) -> FakeArray:
    return a.view(FakeArray)


def empty(shape: Any, dtype: Any = np.float32) -> FakeArray:
    return _fake(np.empty(shape, dtype))


def zeros(shape: Any, dtype: Any = np.float32) -> FakeArray:
    return _fake(np.zeros(shape, dtype))


def ones(shape: Any, dtype: Any = np.float32) -> FakeArray:
    return _fake(np.ones(shape, dtype))


def empty_like(a: Any) -> FakeArray:
    return _fake(np.empty_like(a))


def asarray(a: Any) -> FakeArray:
    return a if isinstance(a, FakeArray) else _fake(np.array(a, copy=True))


def asnumpy(a: Any) -> np.ndarray:
    return np.array(a, copy=True).view(np.ndarray)


def ascontiguousarray(a: Any) -> FakeArray:
    return _fake(np.array(a, order="C"))


def from_dlpack(a: Any) -> FakeArray:
    return _fake(np.from_dlpack(a))


def copyto(dst: Any, src: Any) -> None:
    _later(lambda: np.copyto(dst, src))


def multiply(a: Any, b: Any, out: Any) -> None:
    _later(lambda: np.multiply(a, b, out=out))


def matmul(a: Any, b: Any) -> FakeArray:
    return _fake(np.matmul(a, b))


def einsum(eq: str, *ops: Any) -> FakeArray:
    return _fake(np.einsum(eq, *ops))


class _Pool:
    def free_all_blocks(self) -> None:
        pass


def get_default_memory_pool() -> _Pool:
    return _Pool()


# ---- cupy.cuda ---------------------------------------------------------------------------

class _Function:
    def __init__(self, lib: ctypes.CDLL, symbol: str):
        self.fn = getattr(lib, symbol)

    def __call__(self, grid: tuple, block: tuple, args: list, shared_mem: int = 0,
                 stream: Any = None) -> None:
        cargs = [ctypes.c_int(int(a)) if isinstance(a, np.int32) else ctypes.c_longlong(a)
                 for a in args]
        cargs += [ctypes.c_uint(grid[0]), ctypes.c_uint(block[0])]
        _later(lambda: self.fn(*cargs))


class _Module:
    def load(self, cubin: bytes) -> None:
        text = cubin.decode()
        parts = {id(r): r for s, r in _C_PARTS.items() if s in text}
        self.lib = hostsim.build(source.module_source(list(parts.values())))

    def get_function(self, name: str) -> _Function:
        return _Function(self.lib, name)


class _Graph:
    def __init__(self, thunks: list):
        self.thunks = thunks

    def launch(self, stream: Any = None) -> None:
        for t in self.thunks:
            t()


_STREAMS: list[Any] = []    # the current stream stack (`with stream:`)


class _Stream:
    made = 0

    def __init__(self, non_blocking: bool = False, ptr: int | None = None):
        _Stream.made += 1
        self.ptr = 0x5000 + _Stream.made if ptr is None else ptr

    def __enter__(self) -> Any:
        _STREAMS.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _STREAMS.pop()

    def begin_capture(self) -> None:
        _CAPTURE.append([])

    def end_capture(self) -> _Graph:
        return _Graph(_CAPTURE.pop())


class _Device:
    id = 0
    compute_capability = "90"

    @property
    def attributes(self) -> dict:
        return {"MultiProcessorCount": 4}

    def synchronize(self) -> None:
        pass


class _Event:
    def record(self) -> None:
        import time
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass


def _cuda() -> types.SimpleNamespace:
    runtime = types.SimpleNamespace(getDeviceCount=lambda: 1, runtimeGetVersion=lambda: 13000,
                                    getDeviceProperties=lambda i: {"name": b"FakeGPU"})
    return types.SimpleNamespace(
        Device=_Device, Stream=_Stream, Event=_Event, runtime=runtime,
        get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3,
        function=types.SimpleNamespace(Module=_Module),
        get_current_stream=lambda: _STREAMS[-1] if _STREAMS else _Stream(ptr=0),
        device=types.SimpleNamespace(get_cublas_handle=lambda: 1))


cuda = _cuda()


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


def _flat(ptr: int, n: int, dtype: Any) -> np.ndarray:
    size = np.dtype(dtype).itemsize
    buf = (ctypes.c_char * max(n * size, 1)).from_address(ptr)
    return np.frombuffer(buf, dtype=dtype, count=n)


def _gemm_strided_batched_ex(handle, transa, transb, m, n, k, alpha, a, atype, lda, sa, b,
                             btype, ldb, sb, beta, c, ctype, ldc, sc, batch, compute, algo,
                             capture_ok=False):
    if _CAPTURE and not capture_ok:  # CuPy 14's wrapper: its setStream raises
        raise NotImplementedError("calling cuBLAS API during stream capture is currently "
                                  "unsupported")
    dtype = DTYPES[ctype]
    scalar = np.float64 if dtype == np.float64 else np.float32
    al = _flat(alpha, 1, scalar)[0]
    be = _flat(beta, 1, scalar)[0]
    call = gemm.GemmCall(transa, transb, m, n, k, lda, ldb, ldc, sa, sb, sc, batch)
    extent_a = (m if transa == 0 else k) + lda * ((k if transa == 0 else m) - 1) + sa * (batch - 1)
    extent_b = (k if transb == 0 else n) + ldb * ((n if transb == 0 else k) - 1) + sb * (batch - 1)
    extent_c = m + ldc * (n - 1) + sc * (batch - 1)
    ya = _flat(a, extent_a, dtype).astype(np.float64)
    xb = _flat(b, extent_b, dtype).astype(np.float64)
    out = _flat(c, extent_c, dtype)
    acc = out.astype(np.float64) if be else np.zeros(extent_c)  # beta 0: C is not read
    gemm.emulate(call, xb, ya, acc, float(al), float(be))
    out[...] = acc.astype(dtype)


class FakeLibcublas:
    """libcublas as backends/gpu/blas.py calls it (ctypes functions, status ints), with
    cuBLAS's capture rule: a call captured on a handle without a workspace of the
    caller's fails (cublasSetStream resets the workspace, as the real one does)."""

    def __init__(self) -> None:
        self.stream: dict[int, int] = {}
        self.workspace: dict[int, int] = {}
        self.calls = 0

    def cublasCreate_v2(self, ref: Any) -> int:
        if _CAPTURE:
            return 3  # CUBLAS_STATUS_ALLOC_FAILED: a handle allocates device memory
        ref._obj.value = 100 + len(self.stream)
        self.stream[ref._obj.value] = 0
        return 0

    def cublasSetPointerMode_v2(self, handle: int, mode: int) -> int:
        return 0 if mode == 0 else 7

    def cublasSetStream_v2(self, handle: int, stream: int) -> int:
        self.stream[handle] = stream
        self.workspace.pop(handle, None)
        return 0

    def cublasSetWorkspace_v2(self, handle: int, ptr: int, size: int) -> int:
        self.workspace[handle] = ptr
        return 0

    def cublasGetStatusString(self, status: int) -> bytes:
        return b"CUBLAS_STATUS_NOT_SUPPORTED" if status == 15 else b"CUBLAS_STATUS_ERROR"

    def cublasGemmStridedBatchedEx(self, handle: int, *args: Any) -> int:
        if _CAPTURE and (handle not in self.workspace
                         or self.stream[handle] != _STREAMS[-1].ptr):
            return 15  # cuBLAS would allocate, or run outside the capture
        self.calls += 1
        _later(lambda: _gemm_strided_batched_ex(handle, *args, capture_ok=True))
        return 0


def _cublas() -> types.ModuleType:
    m = types.ModuleType("cupy_backends.cuda.libs.cublas")
    m.setPointerMode = lambda handle, mode: None
    m.gemmStridedBatchedEx = _gemm_strided_batched_ex
    return m


def install(monkeypatch: Any) -> None:
    """Make `import cupy` (and its bindings) load this module; record C renderings."""
    me = sys.modules[__name__]
    libs = types.ModuleType("cupy_backends.cuda.libs")
    libs.nvrtc, libs.cublas = _nvrtc(), _cublas()
    for name, mod in (("cupy", me), ("cupy_backends", types.ModuleType("cupy_backends")),
                      ("cupy_backends.cuda", types.ModuleType("cupy_backends.cuda")),
                      ("cupy_backends.cuda.libs", libs),
                      ("cupy_backends.cuda.libs.nvrtc", libs.nvrtc),
                      ("cupy_backends.cuda.libs.cublas", libs.cublas)):
        monkeypatch.setitem(sys.modules, name, mod)
    real = source.render_program

    def recording(program: Any, target: str, choose_launch: Any = source.choose) -> Any:
        if target == "cuda":
            c = real(program, "c", choose_launch)
            for e in c.kernels.values():
                _C_PARTS[e.symbol] = c
            for sym in c.checks.values():
                _C_PARTS.setdefault(sym, c)
        return real(program, target, choose_launch)

    monkeypatch.setattr(source, "render_program", recording)
    from autoclust.backends.gpu import blas
    monkeypatch.setattr(blas, "_load_library", FakeLibcublas)


def installed(monkeypatch: Any) -> Iterator[None]:
    """install(), with the GPU backend's cached imports and compiled modules forgotten
    before and after: the body of a pytest fixture (`yield from fake_cupy.installed(mp)`)."""
    from autoclust.backends.gpu import blas, device, nvrtc
    install(monkeypatch)
    for cached in (device._import, device.info, blas.get):
        cached.cache_clear()
    yield
    for cached in (device._import, device.info, blas.get):
        cached.cache_clear()
    nvrtc._MODULES.clear()
