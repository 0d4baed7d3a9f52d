"""cuBLAS through ctypes on handles of our own: GEMMs that a CUDA graph can capture.

CuPy 14's cuBLAS wrapper refuses every call while a stream captures (its setStream raises
NotImplementedError: "calling cuBLAS API during stream capture is currently unsupported",
cupy_backends/cuda/libs/cublas.pyx), although cuBLAS itself supports capture once the
handle has a workspace of the caller's (cuBLAS docs, "CUDA Graphs Support"). So the GPU
backend calls libcublas -- the copy CuPy already loaded -- itself:

    lib = blas.get()                         # None: no libcublas found (CuPy's wrapper then)
    h = lib.handle(stream_ptr)               # this thread's handle, on that stream
    lib.gemm_strided_batched_ex(h, ...)      # cublasGemmStridedBatchedEx's arguments

One handle per thread and device (a cuBLAS handle must not be used by two threads at once),
created with host pointer mode. `handle(stream)` points it at the stream of the call and
then at its workspace, in that order (cublasSetStream resets the workspace to cuBLAS's
default pool, which a capture cannot allocate from), and only when the stream changed:
nothing but these calls uses the handle. The same calls run eagerly and under
capture, so the eager GPU tests check the captured GEMMs' arguments too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import threading
from typing import Any

WORKSPACE_BYTES = 32 << 20   # cuBLAS's recommendation for Hopper (4 MiB suffices before)
POINTER_MODE_HOST = 0
_c_int, _c_ll, _c_void_p, _c_size_t = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p, \
    ctypes.c_size_t


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


def _signatures(lib: ctypes.CDLL) -> None:
    h = _c_void_p
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(_c_void_p)]
    lib.cublasSetStream_v2.argtypes = [h, _c_void_p]
    lib.cublasSetWorkspace_v2.argtypes = [h, _c_void_p, _c_size_t]
    lib.cublasSetPointerMode_v2.argtypes = [h, _c_int]
    lib.cublasGetStatusString.restype = ctypes.c_char_p
    lib.cublasGetStatusString.argtypes = [_c_int]
    lib.cublasGemmStridedBatchedEx.argtypes = [
        h, _c_int, _c_int, _c_int, _c_int, _c_int,             # transa, transb, m, n, k
        _c_void_p, _c_void_p, _c_int, _c_int, _c_ll,           # alpha, A, Atype, lda, strideA
        _c_void_p, _c_int, _c_int, _c_ll,                      # B, Btype, ldb, strideB
        _c_void_p, _c_void_p, _c_int, _c_int, _c_ll,           # beta, C, Ctype, ldc, strideC
        _c_int, _c_int, _c_int]                                # batch, compute type, algo
    for fn in ("cublasCreate_v2", "cublasSetStream_v2", "cublasSetWorkspace_v2",
               "cublasSetPointerMode_v2", "cublasGemmStridedBatchedEx"):
        getattr(lib, fn).restype = _c_int


class Blas:
    """libcublas with per-thread handles; `workspace(nbytes)` allocates device memory."""

    def __init__(self, lib: Any, workspace: Any):
        self.lib = lib
        self._workspace = workspace
        self._local = threading.local()

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            text = self.lib.cublasGetStatusString(status)
            raise BlasError(f"{what} failed: {text.decode() if text else status}")

    def handle(self, stream: int) -> int:
        """This thread's handle, set to `stream` and to its own workspace."""
        local = self._local
        if getattr(local, "handle", None) is None:
            h = _c_void_p()
            self._check(self.lib.cublasCreate_v2(ctypes.byref(h)), "cublasCreate")
            self._check(self.lib.cublasSetPointerMode_v2(h, POINTER_MODE_HOST),
                        "cublasSetPointerMode")
            local.workspace = self._workspace(WORKSPACE_BYTES)  # kept alive with the handle
            local.handle = h.value
            local.stream = None
        if local.stream != stream:  # only our calls touch this handle: set once per stream
            self._check(self.lib.cublasSetStream_v2(local.handle, stream), "cublasSetStream")
            self._check(self.lib.cublasSetWorkspace_v2(local.handle, local.workspace.data.ptr,
                                                       WORKSPACE_BYTES), "cublasSetWorkspace")
            local.stream = stream
        return local.handle

    def gemm_strided_batched_ex(self, handle: int, *args: Any) -> None:
        """cublasGemmStridedBatchedEx(handle, *args); BlasError on a failed status."""
        self._check(self.lib.cublasGemmStridedBatchedEx(handle, *args),
                    "cublasGemmStridedBatchedEx")


def _load_library() -> Any:
    """libcublas as a ctypes library with its signatures set, or None."""
    try:
        import cupy_backends.cuda.libs.cublas  # noqa: F401 - maps CuPy's libcublas
    except ImportError:
        return None
    path = _loaded_path() or ctypes.util.find_library("cublas")
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
        _signatures(lib)
    except (OSError, AttributeError):
        return None
    return lib


@functools.lru_cache(maxsize=1)
def get() -> Blas | None:
    """The cuBLAS binding, or None where no libcublas can be loaded (GEMMs then go through
    CuPy's wrapper and plans with them are not captured)."""
    from autoclust.backends.gpu import device
    cp = device.cupy()
    lib = _load_library()
    if lib is None:
        return None
    return Blas(lib, lambda nbytes: cp.empty(nbytes, dtype=cp.uint8))
