"""cuBLAS through ctypes on handles of our own: GEMMs that a CUDA graph can capture.

CuPy 14's cuBLAS wrapper refuses every call while a stream captures (its setStream raises
NotImplementedError: "calling cuBLAS API during stream capture is currently unsupported",
cupy_backends/cuda/libs/cublas.pyx), although cuBLAS itself supports capture once the
handle has a workspace of the caller's (cuBLAS docs, "CUDA Graphs Support"). So the GPU
backend calls libcublas itself:

    lib = blas.get()                         # None: no libcublas (blas.reason() says why)
    h = lib.handle(stream_ptr)               # this thread's handle, on that stream
    lib.gemm_strided_batched_ex(h, ...)      # cublasGemmStridedBatchedEx's arguments

Locating libcublas: cuda-pathfinder (`load_nvidia_dynamic_lib`, the loader CuPy 14's own
`cupy_backends.cuda.libs` package calls before importing its cuBLAS binding: the wheels'
modules have no RPATH), else CuPy's package-level loader (`from cupy_backends.cuda.libs
import cublas`, which runs that hook) and the copy it mapped. Importing the submodule
directly skips the hook: libcublas was then only found in processes that had imported
torch first.

One handle per thread and device (a cuBLAS handle must not be used by two threads at once),
created with host pointer mode. One workspace per stream (cuBLAS forbids two streams
sharing one), kept for the life of the process: a CUDA graph captured with it keeps its
address, so it must outlive every graph, whichever thread captured it. `handle(stream)`
points the handle at the stream and then at that stream's workspace, in that order
(cublasSetStream resets the workspace to cuBLAS's default pool, which a capture cannot
allocate from), and only when the stream changed. The same calls run eagerly and under
capture, so the eager GPU tests check the captured GEMMs' arguments too.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

WORKSPACE_BYTES = 32 << 20   # cuBLAS's recommendation for Hopper (4 MiB suffices before)
POINTER_MODE_HOST = 0
_c_int, _c_ll, _c_void_p, _c_size_t = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p, \
    ctypes.c_size_t
_REASON: list[str] = [""]   # why get() found no libcublas
WRAPPER = "calls cuBLAS through CuPy's wrapper, which refuses stream capture"


class BlasError(RuntimeError):
    """A cuBLAS call returned an error status."""


def _loaded_path() -> str | None:
    """The libcublas this process has mapped (CuPy's, once its binding is imported)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if line.strip() else ""
                name = path.rsplit("/", 1)[-1]
                if name.startswith("libcublas.so"):
                    return path
    except OSError:
        pass
    return None


def _signatures(lib: Any) -> None:
    h = _c_void_p
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(_c_void_p)]
    lib.cublasSetStream_v2.argtypes = [h, _c_void_p]
    lib.cublasSetWorkspace_v2.argtypes = [h, _c_void_p, _c_size_t]
    lib.cublasSetPointerMode_v2.argtypes = [h, _c_int]
    lib.cublasGetVersion_v2.argtypes = [h, ctypes.POINTER(_c_int)]
    lib.cublasGetStatusString.restype = ctypes.c_char_p
    lib.cublasGetStatusString.argtypes = [_c_int]
    lib.cublasGemmStridedBatchedEx.argtypes = [
        h, _c_int, _c_int, _c_int, _c_int, _c_int,             # transa, transb, m, n, k
        _c_void_p, _c_void_p, _c_int, _c_int, _c_ll,           # alpha, A, Atype, lda, strideA
        _c_void_p, _c_int, _c_int, _c_ll,                      # B, Btype, ldb, strideB
        _c_void_p, _c_void_p, _c_int, _c_int, _c_ll,           # beta, C, Ctype, ldc, strideC
        _c_int, _c_int, _c_int]                                # batch, compute type, algo
    for fn in ("cublasCreate_v2", "cublasSetStream_v2", "cublasSetWorkspace_v2",
               "cublasSetPointerMode_v2", "cublasGetVersion_v2", "cublasGemmStridedBatchedEx"):
        getattr(lib, fn).restype = _c_int


class Blas:
    """libcublas with per-thread handles; `workspace(nbytes)` allocates device memory."""

    def __init__(self, lib: Any, workspace: Any, path: str = ""):
        self.lib = lib
        self.path = path
        self._workspace = workspace
        self._local = threading.local()
        self._lock = threading.Lock()
        self.workspaces: dict[int, Any] = {}  # stream -> its workspace, never freed

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            text = self.lib.cublasGetStatusString(status)
            raise BlasError(f"{what} failed: {text.decode() if text else status}")

    def workspace(self, stream: int) -> Any:
        """The workspace of `stream` (made on first use: call before a capture begins)."""
        with self._lock:
            ws = self.workspaces.get(stream)
            if ws is None:
                ws = self.workspaces[stream] = self._workspace(WORKSPACE_BYTES)
            return ws

    def handle(self, stream: int) -> int:
        """This thread's handle, set to `stream` and to that stream's workspace."""
        local = self._local
        if getattr(local, "handle", None) is None:
            h = _c_void_p()
            self._check(self.lib.cublasCreate_v2(ctypes.byref(h)), "cublasCreate")
            self._check(self.lib.cublasSetPointerMode_v2(h, POINTER_MODE_HOST),
                        "cublasSetPointerMode")
            local.handle = h.value
            local.stream = None
        if local.stream != stream:  # only our calls touch this handle: set once per stream
            ws = self.workspace(stream)
            self._check(self.lib.cublasSetStream_v2(local.handle, stream), "cublasSetStream")
            self._check(self.lib.cublasSetWorkspace_v2(local.handle, ws.data.ptr,
                                                       WORKSPACE_BYTES), "cublasSetWorkspace")
            local.stream = stream
        return local.handle

    def version(self) -> int:
        """cublasGetVersion of a handle of this thread (e.g. 130100 for 13.1.0)."""
        v = _c_int()
        self._check(self.lib.cublasGetVersion_v2(self.handle(0), ctypes.byref(v)),
                    "cublasGetVersion")
        return v.value

    def gemm_strided_batched_ex(self, handle: int, *args: Any) -> None:
        """cublasGemmStridedBatchedEx(handle, *args); BlasError on a failed status."""
        self._check(self.lib.cublasGemmStridedBatchedEx(handle, *args),
                    "cublasGemmStridedBatchedEx")


def _open(path: str) -> Any:
    """The shared library at `path` (tests substitute the stand-in cuBLAS)."""
    return ctypes.CDLL(path)


def locate(name: str = "cublas") -> tuple[str | None, str]:
    """(path of NVIDIA library `name`, '') or (None, why it was not found): cuda-pathfinder
    first, then (libcublas) CuPy's package-level loader and the copy it mapped."""
    try:
        from cuda import pathfinder
    except ImportError as exc:
        pathfinder, why = None, f"cuda-pathfinder is not installed ({exc})"
    if pathfinder is not None:
        try:
            return pathfinder.load_nvidia_dynamic_lib(name).abs_path, ""
        except Exception as exc:  # noqa: BLE001 - DynamicLibNotFoundError (a RuntimeError)
            why = f"cuda-pathfinder did not find lib{name} ({type(exc).__name__}: {exc})"
    if name != "cublas":
        return None, why
    try:  # the package attribute, not the submodule: it runs CuPy's loading hook
        from cupy_backends.cuda.libs import cublas  # noqa: F401
    except ImportError as exc:
        return None, f"{why}; CuPy's cuBLAS binding failed to load ({exc})"
    path = _loaded_path()
    return (path, "") if path else (None, f"{why}; no libcublas is mapped in this process")


def _load_library() -> tuple[Any, str]:
    """(libcublas as a ctypes library with its signatures set, its path), or (None, why)."""
    path, why = locate("cublas")
    if path is None:
        return None, why
    try:
        lib = _open(path)
        _signatures(lib)
    except (OSError, AttributeError) as exc:
        return None, f"{path} could not be loaded ({type(exc).__name__}: {exc})"
    return lib, path


def reason() -> str:
    """Why get() found no libcublas ('' when it did, or has not been asked)."""
    return _REASON[0]


@functools.lru_cache(maxsize=1)
def get() -> Blas | None:
    """The cuBLAS binding, or None where no libcublas can be loaded (GEMMs then go through
    CuPy's wrapper and plans with them are not captured; reason() says why)."""
    from autoclust.backends.gpu import device
    cp = device.cupy()
    lib, where = _load_library()
    if lib is None:
        _REASON[0] = where
        return None
    _REASON[0] = ""
    return Blas(lib, lambda nbytes: cp.empty(nbytes, dtype=cp.uint8), where)
