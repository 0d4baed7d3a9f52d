"""The stand-in cuBLAS of tests/support/fake_cupy.py: libcublas as blas.py loads it, CuPy's
wrapper, cuda-pathfinder, and a GEMM reference independent of backends/gpu/gemm.py.

The reference is cuBLAS's contract written out, not our planner's emulation of it: every
matrix is a column-major view (numpy strides (1, ld) elements) of the raw device memory at
its pointer, op(A) is that view or its transpose, batches step by their strides, and
C = alpha * op(A) op(B) + beta * C runs in float64 (C is not read when beta is 0), rounded
once to C's type. TF32 compute rounds the inputs to TF32 first. An illegal leading
dimension or type/compute combination returns cuBLAS's status instead of running.
"""

from __future__ import annotations

import ctypes
import types
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

DTYPES = {0: np.dtype(np.float32), 1: np.dtype(np.float64), 2: np.dtype(np.float16),
          14: np.dtype(ml_dtypes.bfloat16)}
COMPUTE_32F, COMPUTE_32F_PEDANTIC, COMPUTE_64F, COMPUTE_32F_FAST_TF32 = 68, 69, 70, 77
# cublasGemmEx's legal (A/B/C type -> compute types) for the types we use
LEGAL = {0: {COMPUTE_32F, COMPUTE_32F_PEDANTIC, COMPUTE_32F_FAST_TF32}, 1: {COMPUTE_64F},
         2: {COMPUTE_32F}, 14: {COMPUTE_32F}}
SUCCESS, INVALID_VALUE, NOT_SUPPORTED = 0, 7, 15
CALLS: list[dict] = []   # every GEMM run (the arguments tests check)


def _view(ptr: int, dtype: np.dtype, rows: int, cols: int, ld: int, batch: int,
          stride: int) -> np.ndarray:
    """[batch, rows, cols] column-major matrices at device address ptr."""
    size = dtype.itemsize
    extent = (rows - 1) + ld * (cols - 1) + stride * (batch - 1) + 1
    buf = (ctypes.c_char * max(extent * size, 1)).from_address(ptr)
    flat = np.frombuffer(buf, dtype=dtype, count=extent)
    return np.lib.stride_tricks.as_strided(flat, (batch, rows, cols),
                                           (stride * size, size, ld * size))


def _tf32(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32 (10 mantissa bits, nearest even)."""
    u = x.astype(np.float32).view(np.uint32)
    u = (u + 0xFFF + ((u >> 13) & 1)) & np.uint32(0xFFFFE000)
    return u.view(np.float32)


def _product(transa: int, transb: int, m: int, n: int, k: int, alpha: int, a: int,
             atype: int, lda: int, sa: int, b: int, ldb: int, sb: int, beta: int, c: int,
             ldc: int, sc: int, batch: int, compute: int) -> tuple[np.ndarray, np.ndarray]:
    """(C's column-major view, alpha * op(A) op(B) + beta * C in float64)."""
    dtype = DTYPES[atype]
    scalar = np.float64 if compute == COMPUTE_64F else np.float32
    al = float(np.frombuffer((ctypes.c_char * 8).from_address(alpha), scalar, 1)[0])
    be = float(np.frombuffer((ctypes.c_char * 8).from_address(beta), scalar, 1)[0])
    ar, ac = (m, k) if transa == 0 else (k, m)
    br, bc = (k, n) if transb == 0 else (n, k)
    out = _view(c, dtype, m, n, ldc, batch, sc)
    if k == 0:
        prod = np.zeros((batch, m, n))
    else:
        av = _view(a, dtype, ar, ac, lda, batch, sa)
        bv = _view(b, dtype, br, bc, ldb, batch, sb)
        if compute == COMPUTE_32F_FAST_TF32:
            av, bv = _tf32(av), _tf32(bv)
        opa = av if transa == 0 else np.swapaxes(av, 1, 2)
        opb = bv if transb == 0 else np.swapaxes(bv, 1, 2)
        prod = np.matmul(opa.astype(np.float64), opb.astype(np.float64))
    res = al * prod
    if be != 0.0:  # (beta 0: C is not read)
        res = res + be * out.astype(np.float64)
    return out, res


def _legal(transa: int, transb: int, m: int, n: int, k: int, atype: int, lda: int,
           btype: int, ldb: int, ctype: int, ldc: int, batch: int, compute: int) -> int:
    """cuBLAS's status for these types and dimensions (SUCCESS when it would run)."""
    if not atype == btype == ctype or compute not in LEGAL.get(ctype, ()):
        return NOT_SUPPORTED
    ar = m if transa == 0 else k
    br = k if transb == 0 else n
    if min(m, n, k, batch) < 0 or lda < max(1, ar) or ldb < max(1, br) or ldc < max(1, m):
        return INVALID_VALUE
    return SUCCESS


def gemm(transa: int, transb: int, m: int, n: int, k: int, alpha: int, a: int, atype: int,
         lda: int, sa: int, b: int, btype: int, ldb: int, sb: int, beta: int, c: int,
         ctype: int, ldc: int, sc: int, batch: int, compute: int, algo: int) -> int:
    """cublasGemmStridedBatchedEx on raw pointers (host pointer mode); its status."""
    status = _legal(transa, transb, m, n, k, atype, lda, btype, ldb, ctype, ldc, batch, compute)
    if status != SUCCESS:
        return status
    CALLS.append({"m": m, "n": n, "k": k, "batch": batch, "compute": compute, "type": ctype})
    if m == 0 or n == 0 or batch == 0:
        return SUCCESS
    out, res = _product(transa, transb, m, n, k, alpha, a, atype, lda, sa, b, ldb, sb, beta,
                        c, ldc, sc, batch, compute)
    out[...] = res.astype(DTYPES[ctype])
    return SUCCESS


class _Fn:
    """A ctypes-like function: argtypes and restype may be set; arguments are converted
    (and checked) through argtypes, as ctypes does."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.argtypes: list | None = None
        self.restype: Any = ctypes.c_int

    def __call__(self, *args: Any) -> Any:
        if self.argtypes is not None:
            if len(args) != len(self.argtypes):
                raise TypeError(f"this function takes {len(self.argtypes)} arguments "
                                f"({len(args)} given)")
            args = tuple(_convert(t, a) for t, a in zip(self.argtypes, args))
        return self.fn(*args)


def _convert(ctype: Any, value: Any) -> Any:
    if isinstance(value, ctypes._SimpleCData) and not isinstance(value, ctype):
        raise ctypes.ArgumentError(f"expected {ctype.__name__}, got {type(value).__name__}")
    if hasattr(ctype, "_type_") and isinstance(ctype._type_, str) and \
            not isinstance(value, ctypes._SimpleCData):
        if ctype._type_ in "iqlhbIQLHB" and not isinstance(value, (int, np.integer)):
            raise ctypes.ArgumentError(f"expected an integer for {ctype.__name__}, got "
                                       f"{type(value).__name__}")
        return ctype(value).value if ctype is not ctypes.c_void_p else value
    return value


class FakeLibcublas:
    """libcublas as backends/gpu/blas.py calls it (ctypes functions, status ints), with
    cuBLAS's capture rules: creating a handle allocates (refused under capture), and a
    call captured on a handle without a workspace of the caller's, or on another stream
    than the capturing one, fails (cublasSetStream resets the workspace, as the real one
    does)."""

    def __init__(self, later: Callable, current_stream: Callable, captures: dict,
                 alive: Callable[[int], bool]):
        self._later, self._current, self._captures = later, current_stream, captures
        self._alive = alive
        self.stream: dict[int, int] = {}
        self.workspace: dict[int, int] = {}
        self.workspace_stream: dict[int, int] = {}  # workspace -> the one stream using it
        self.calls = 0
        for name in ("cublasCreate_v2", "cublasSetPointerMode_v2", "cublasSetStream_v2",
                     "cublasSetWorkspace_v2", "cublasGetStatusString", "cublasGetVersion_v2",
                     "cublasGemmStridedBatchedEx"):
            setattr(self, name, _Fn(getattr(self, "_" + name)))

    def _cublasCreate_v2(self, ref: Any) -> int:
        if self._captures:
            return 3  # CUBLAS_STATUS_ALLOC_FAILED: a handle allocates device memory
        ref._obj.value = 100 + len(self.stream)
        self.stream[ref._obj.value] = 0
        return SUCCESS

    def _cublasSetPointerMode_v2(self, handle: int, mode: int) -> int:
        return SUCCESS if mode == 0 else INVALID_VALUE

    def _cublasSetStream_v2(self, handle: int, stream: int) -> int:
        self.stream[handle] = stream or 0
        self.workspace.pop(handle, None)
        return SUCCESS

    def _cublasSetWorkspace_v2(self, handle: int, ptr: int, size: int) -> int:
        # cuBLAS: a workspace must not be shared by streams (their GEMMs would overlap)
        if self.workspace_stream.setdefault(ptr, self.stream[handle]) != self.stream[handle]:
            return INVALID_VALUE
        self.workspace[handle] = ptr
        return SUCCESS

    def _cublasGetVersion_v2(self, handle: int, ref: Any) -> int:
        ref._obj.value = 130100
        return SUCCESS

    def _cublasGetStatusString(self, status: int) -> bytes:
        return {NOT_SUPPORTED: b"CUBLAS_STATUS_NOT_SUPPORTED",
                INVALID_VALUE: b"CUBLAS_STATUS_INVALID_VALUE"}.get(status,
                                                                  b"CUBLAS_STATUS_ERROR")

    def _cublasGemmStridedBatchedEx(self, handle: int, *args: Any) -> int:
        current = self._current().ptr
        if self._captures and (handle not in self.workspace or self.stream[handle] != current
                               or current not in self._captures):
            return NOT_SUPPORTED  # cuBLAS would allocate, or run outside the capture
        if self.stream[handle] != current:
            return INVALID_VALUE  # the handle's stream is not the one this work belongs to
        self.calls += 1
        status = [SUCCESS]
        workspace = self.workspace.get(handle)

        def run() -> None:
            if workspace is not None and not self._alive(workspace):
                raise RuntimeError("stand-in cuBLAS: this GEMM's workspace was freed (a graph "
                                   "or a handle outlived it)")
            status[0] = gemm(*args)
            if status[0] != SUCCESS:
                raise RuntimeError(f"stand-in cuBLAS: status {status[0]} on {args}")

        self._later(run, "cublasGemmStridedBatchedEx")
        return SUCCESS


def wrapper_module(later: Callable) -> types.ModuleType:
    """cupy_backends.cuda.libs.cublas: refuses to run while a stream captures, as CuPy
    14's does (its setStream raises)."""
    from support import fake_cupy
    m = types.ModuleType("cupy_backends.cuda.libs.cublas")
    m.setPointerMode = lambda handle, mode: None

    def gemm_ex(handle: int, *args: Any) -> None:
        if fake_cupy._capturing():
            raise NotImplementedError("calling cuBLAS API during stream capture is currently "
                                      "unsupported")

        def run() -> None:
            status = gemm(*args)
            if status != SUCCESS:
                raise RuntimeError(f"CUBLASError: status {status}")

        later(run, "cublas.gemmStridedBatchedEx")

    m.gemmStridedBatchedEx = gemm_ex
    return m


class DynamicLibNotFoundError(RuntimeError):
    pass


def pathfinder_module(found: tuple[str, ...] = ("cublas", "cublasLt", "nvrtc", "cudart")
                      ) -> types.ModuleType:
    """cuda.pathfinder finding the stand-in libraries by name."""
    m = types.ModuleType("cuda.pathfinder")
    m.DynamicLibNotFoundError = DynamicLibNotFoundError
    m.SUPPORTED_NVIDIA_LIBNAMES = found
    m.__version__ = "1.9.1+fake"

    def load(name: str) -> Any:
        if name not in found:
            raise DynamicLibNotFoundError(f"Failure finding lib{name}.so")
        return types.SimpleNamespace(abs_path=f"/stand-in/lib{name}.so.13",
                                     was_already_loaded_from_elsewhere=False)

    m.load_nvidia_dynamic_lib = load
    return m


def open_library(later: Callable, current_stream: Callable, captures: dict,
                 alive: Callable[[int], bool]) -> Callable[[str], Any]:
    """blas._open for the stand-in: the fake libcublas (or libcublasLt) at the path
    pathfinder gave."""
    def open_(path: str) -> Any:
        if path.startswith("/stand-in/libcublas.so"):
            return FakeLibcublas(later, current_stream, captures, alive)
        if path.startswith("/stand-in/libcublasLt.so"):
            return FakeLibcublasLt(later, current_stream, alive)
        raise OSError(f"{path}: cannot open shared object file")
    return open_


# ---- cuBLASLt ------------------------------------------------------------------------------

def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """cuBLASLt's GELU epilogue: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


class FakeLibcublasLt:
    """libcublasLt as backends/gpu/blaslt.py calls it: descriptors, layouts, a heuristic
    offering one algorithm for legal problems, and cublasLtMatmul with the DEFAULT, BIAS,
    GELU and GELU_BIAS epilogues (bias: one value per row of D, added before GELU; the
    whole epilogue in float64, rounded once)."""

    def __init__(self, later: Callable, current_stream: Callable, alive: Callable):
        self._later, self._current, self._alive = later, current_stream, alive
        self.objects: dict[int, dict] = {}
        self.calls: list[dict] = []
        for name in ("cublasLtCreate", "cublasLtMatmulDescCreate",
                     "cublasLtMatmulDescSetAttribute", "cublasLtMatrixLayoutCreate",
                     "cublasLtMatrixLayoutSetAttribute", "cublasLtMatmulPreferenceCreate",
                     "cublasLtMatmulPreferenceSetAttribute", "cublasLtMatmulAlgoGetHeuristic",
                     "cublasLtMatmul"):
            setattr(self, name, _Fn(getattr(self, "_" + name)))

    def _new(self, ref: Any, **fields: Any) -> int:
        key = 0x7000 + len(self.objects)
        self.objects[key] = dict(fields)
        ref._obj.value = key
        return SUCCESS

    def _cublasLtCreate(self, ref: Any) -> int:
        return self._new(ref, kind="handle")

    def _cublasLtMatmulDescCreate(self, ref: Any, compute: int, scale: int) -> int:
        return self._new(ref, kind="desc", compute=compute, scale=scale, transa=0, transb=0,
                         epilogue=1, bias=0)

    def _set(self, obj: int, attr: int, buf: Any, size: int, names: dict) -> int:
        if attr not in names:
            return INVALID_VALUE
        self.objects[obj][names[attr]] = buf._obj.value
        return SUCCESS

    def _cublasLtMatmulDescSetAttribute(self, desc: int, attr: int, buf: Any, size: int) -> int:
        return self._set(desc, attr, buf, size, {3: "transa", 4: "transb", 7: "epilogue",
                                                 8: "bias"})

    def _cublasLtMatrixLayoutCreate(self, ref: Any, dtype: int, rows: int, cols: int,
                                    ld: int) -> int:
        return self._new(ref, kind="layout", dtype=dtype, rows=rows, cols=cols, ld=ld, batch=1,
                         stride=0)

    def _cublasLtMatrixLayoutSetAttribute(self, lay: int, attr: int, buf: Any, size: int
                                          ) -> int:
        return self._set(lay, attr, buf, size, {5: "batch", 6: "stride"})

    def _cublasLtMatmulPreferenceCreate(self, ref: Any) -> int:
        return self._new(ref, kind="pref", workspace=0)

    def _cublasLtMatmulPreferenceSetAttribute(self, pref: int, attr: int, buf: Any,
                                              size: int) -> int:
        return self._set(pref, attr, buf, size, {1: "workspace"})

    def _problem(self, desc: int, a: int, b: int, c: int) -> tuple:
        d, la, lb, lc = (self.objects[x] for x in (desc, a, b, c))
        m, n = lc["rows"], lc["cols"]
        k = la["cols"] if d["transa"] == 0 else la["rows"]
        return d, la, lb, lc, m, n, k

    def _cublasLtMatmulAlgoGetHeuristic(self, handle: int, desc: int, a: int, b: int, c: int,
                                        dd: int, pref: int, requested: int, result: Any,
                                        count: Any) -> int:
        d, la, lb, lc, m, n, k = self._problem(desc, a, b, c)
        status = _legal(d["transa"], d["transb"], m, n, k, la["dtype"], la["ld"], lb["dtype"],
                        lb["ld"], lc["dtype"], lc["ld"], lc["batch"], d["compute"])
        ok = status == SUCCESS and d["epilogue"] in (1, 4, 32, 36)
        result._obj.state = SUCCESS
        count._obj.value = 1 if ok else 0
        return SUCCESS

    def _cublasLtMatmul(self, handle: int, desc: int, alpha: int, a: int, adesc: int, b: int,
                        bdesc: int, beta: int, c: int, cdesc: int, d_ptr: int, ddesc: int,
                        algo: Any, workspace: int, wsize: int, stream: int) -> int:
        d, la, lb, lc, m, n, k = self._problem(desc, adesc, bdesc, cdesc)
        if stream != self._current().ptr or c != d_ptr:
            return INVALID_VALUE  # (the backend always runs D = C on the current stream)
        self.calls.append({"m": m, "n": n, "k": k, "epilogue": d["epilogue"]})
        bias, epilogue = d["bias"], d["epilogue"]

        def run() -> None:
            if not self._alive(workspace):
                raise RuntimeError("stand-in cuBLASLt: the workspace was freed")
            out, res = _product(d["transa"], d["transb"], m, n, k, alpha, a, la["dtype"],
                                la["ld"], la["stride"], b, lb["ld"], lb["stride"], beta, c,
                                lc["ld"], lc["stride"], lc["batch"], d["compute"])
            if epilogue in (4, 36):  # BIAS, GELU_BIAS
                res = res + _view(bias, DTYPES[lc["dtype"]], m, 1, m, 1, 0).astype(np.float64)
            if epilogue in (32, 36):  # GELU, GELU_BIAS
                res = gelu_tanh(res)
            out[...] = res.astype(DTYPES[lc["dtype"]])

        self._later(run, "cublasLtMatmul")
        return SUCCESS
