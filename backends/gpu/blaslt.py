"""cuBLASLt through ctypes: GEMMs with an epilogue (bias, GELU) in the GEMM's own kernel.

A Gemm whose C is a bias row ([N], beta 1) otherwise costs a pre-fill of the output (a
kernel writing the broadcast bias) before cuBLAS accumulates into it; cuBLASLt adds the
bias in its epilogue instead. Bound here (and run on the stand-in) are the epilogues
DEFAULT, BIAS, GELU and GELU_BIAS (cuBLASLt's GELU is the tanh approximation, ONNX Gelu's
approximate="tanh"); the backend uses BIAS for such Gemm calls (library.py).

    lt = blaslt.get()                                   # None: no libcublasLt
    plan = lt.plan(call, "float32", compute, blaslt.BIAS)   # None: no algorithm for it
    lt.matmul(plan, alpha, y, x, beta, out, bias, workspace, stream)

A plan (matmul descriptor, the four layouts, the algorithm cuBLASLt's heuristic chose for
our workspace) is made once per call site, at compile time; only the bias pointer is set
per run. The same call runs eagerly and under CUDA graph capture (cuBLASLt supports
capture with a workspace of the caller's, which the per-stream workspace of blas.py is).
Layouts follow gemm.py: column-major, cuBLAS's A is our right operand.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import threading
from typing import Any

from autoclust.backends.gpu import blas, gemm

DEFAULT, BIAS, GELU, GELU_BIAS = 1, 4, 32, 36            # cublasLtEpilogue_t
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER = 3, 4, 7, 8
LAYOUT_BATCH_COUNT, LAYOUT_STRIDED_BATCH_OFFSET = 5, 6
PREF_MAX_WORKSPACE_BYTES = 1
_v, _i, _u64, _i64, _sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64, \
    ctypes.c_size_t


class Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class Heuristic(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t."""

    _fields_ = [("algo", Algo), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _signatures(lib: Any) -> None:
    p = ctypes.POINTER(_v)
    table = {
        "cublasLtCreate": [p],
        "cublasLtMatmulDescCreate": [p, _i, _i],
        "cublasLtMatmulDescSetAttribute": [_v, _i, _v, _sz],
        "cublasLtMatrixLayoutCreate": [p, _i, _u64, _u64, _i64],
        "cublasLtMatrixLayoutSetAttribute": [_v, _i, _v, _sz],
        "cublasLtMatmulPreferenceCreate": [p],
        "cublasLtMatmulPreferenceSetAttribute": [_v, _i, _v, _sz],
        "cublasLtMatmulAlgoGetHeuristic": [_v, _v, _v, _v, _v, _v, _v, _i,
                                           ctypes.POINTER(Heuristic), ctypes.POINTER(_i)],
        "cublasLtMatmul": [_v, _v, _v, _v, _v, _v, _v, _v, _v, _v, _v, _v,
                           ctypes.POINTER(Algo), _v, _sz, _v],
    }
    for name, args in table.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = _i


@dataclasses.dataclass
class Plan:
    """One Gemm call site's descriptor, layouts and algorithm."""

    desc: int
    layouts: tuple[int, int, int]     # A, B, C (= D)
    algo: Algo
    call: gemm.GemmCall
    epilogue: int


class Lt:
    """libcublasLt with one handle (cuBLASLt handles are thread-safe) and plans."""

    def __init__(self, lib: Any, path: str = ""):
        self.lib = lib
        self.path = path
        self._lock = threading.Lock()
        self._handle: int | None = None

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise blas.BlasError(f"{what} failed: status {status}")

    def handle(self) -> int:
        with self._lock:
            if self._handle is None:
                h = _v()
                self._check(self.lib.cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
                self._handle = h.value
            return self._handle

    def _set(self, fn: Any, obj: int, attr: int, value: Any, what: str) -> None:
        self._check(fn(obj, attr, ctypes.byref(value), ctypes.sizeof(value)), what)

    def _layout(self, dtype: int, rows: int, cols: int, ld: int, batch: int,
                stride: int) -> int:
        lay = _v()
        self._check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), dtype, rows, cols,
                                                        ld), "cublasLtMatrixLayoutCreate")
        if batch > 1:
            set_ = self.lib.cublasLtMatrixLayoutSetAttribute
            self._set(set_, lay.value, LAYOUT_BATCH_COUNT, ctypes.c_int(batch), "batch")
            self._set(set_, lay.value, LAYOUT_STRIDED_BATCH_OFFSET, ctypes.c_int64(stride),
                      "stride")
        return lay.value

    def plan(self, call: gemm.GemmCall, dtype: int, compute: int, scale_type: int,
             epilogue: int) -> Plan | None:
        """The plan of one GemmCall with `epilogue`, or None where cuBLASLt's heuristic
        offers no algorithm for it (the caller then uses cuBLAS without the epilogue)."""
        desc = _v()
        self._check(self.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), compute,
                                                      scale_type), "cublasLtMatmulDescCreate")
        set_ = self.lib.cublasLtMatmulDescSetAttribute
        for attr, value in ((DESC_TRANSA, call.transa), (DESC_TRANSB, call.transb),
                            (DESC_EPILOGUE, epilogue)):
            self._set(set_, desc.value, attr, ctypes.c_int(value), "cublasLtMatmulDesc")
        c = call
        a_rows, a_cols = (c.m, c.k) if c.transa == gemm.OP_N else (c.k, c.m)
        b_rows, b_cols = (c.k, c.n) if c.transb == gemm.OP_N else (c.n, c.k)
        layouts = (self._layout(dtype, a_rows, a_cols, c.lda, c.batch, c.stride_a),
                   self._layout(dtype, b_rows, b_cols, c.ldb, c.batch, c.stride_b),
                   self._layout(dtype, c.m, c.n, c.ldc, c.batch, c.stride_c))
        pref = _v()
        self._check(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)),
                    "cublasLtMatmulPreferenceCreate")
        self._set(self.lib.cublasLtMatmulPreferenceSetAttribute, pref.value,
                  PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(blas.WORKSPACE_BYTES), "pref")
        result, count = Heuristic(), _i(0)
        status = self.lib.cublasLtMatmulAlgoGetHeuristic(
            self.handle(), desc.value, layouts[0], layouts[1], layouts[2], layouts[2],
            pref.value, 1, ctypes.byref(result), ctypes.byref(count))
        if status != 0 or count.value < 1 or result.state != 0:
            return None
        return Plan(desc.value, layouts, result.algo, call, epilogue)

    def matmul(self, plan: Plan, alpha: int, a: int, b: int, beta: int, c: int, bias: int,
               workspace: int, stream: int) -> None:
        """D = C = epilogue(alpha * op(A) op(B) + beta * C [+ bias]) on `stream`."""
        if plan.epilogue in (BIAS, GELU_BIAS):
            self._set(self.lib.cublasLtMatmulDescSetAttribute, plan.desc, DESC_BIAS_POINTER,
                      ctypes.c_void_p(bias), "bias pointer")
        la, lb, lc = plan.layouts
        self._check(self.lib.cublasLtMatmul(self.handle(), plan.desc, alpha, a, la, b, lb,
                                            beta, c, lc, c, lc, ctypes.byref(plan.algo),
                                            workspace, blas.WORKSPACE_BYTES, stream),
                    "cublasLtMatmul")


@functools.lru_cache(maxsize=1)
def get() -> Lt | None:
    """The cuBLASLt binding, or None where libcublasLt cannot be loaded."""
    path, _ = blas.locate("cublasLt")
    if path is None:
        return None
    try:
        lib = blas._open(path)
        _signatures(lib)
    except (OSError, AttributeError):
        return None
    return Lt(lib, path)
