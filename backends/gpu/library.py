"""Library calls of the GPU backend: MatMul, Gemm, FusedMatMul through cuBLAS, Einsum.

Float MatMul/Gemm/FusedMatMul are cuBLAS gemmStridedBatchedEx calls planned by gemm.py
(batched and broadcast MatMuls included) writing straight into the output buffer. float32
computes in float32 (CUBLAS_COMPUTE_32F: no TF32 on a handle in the default math mode, but
cuBLAS may pick any float32 kernel, split-K included; _PEDANTIC would forbid those) unless
--allow_tf32 (CUBLAS_COMPUTE_32F_FAST_TF32); float16 and bfloat16 multiply on the tensor
cores with float32 accumulation (CUBLAS_COMPUTE_32F, CUDA_R_16F / CUDA_R_16BF) and round
once; float64 in float64. Gemm's C is written into the output first (scaled by beta) and
accumulated with beta = 1 (not for bfloat16: CuPy cannot scale it; such a Gemm falls
back). Integer MatMul and Einsum go through CuPy (cupy.matmul / cupy.einsum, then a copy).

Conv (1-D, 2-D): conv.py, im2col and cuBLAS or onnxruntime on the host, chosen by timing
at each call site. Not here: ConvTranspose and pooling. CuPy 14 removed every cuDNN
binding (its upgrade guide: "CuPy v14 no longer supports cuDNN"), so the GPU policy leaves
them to onnxruntime on the host (with the BatchNorm/activation epilogues it fuses into
them).

CUDA graphs: CuPy 14's cuBLAS wrapper refuses calls while a stream is capturing (its
setStream raises NotImplementedError), so the GEMMs call libcublas through ctypes on
handles of our own with a user workspace (blas.py), which capture allows. Where no
libcublas can be loaded they go through CuPy's wrapper and the plan runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from autoclust.backends.gpu import gemm

from autoclust import ops
from autoclust.errors import CompileError
from autoclust.kernel import ir as kir
from autoclust.ops import attention as attn
from autoclust.ops import custom

CUDA_R = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14}  # cudaDataType_t
COMPUTE_32F, COMPUTE_32F_PEDANTIC, COMPUTE_64F, COMPUTE_32F_FAST_TF32 = 68, 69, 70, 77
GEMM_DEFAULT = -1
POINTER_MODE_HOST = 0
INT32_MAX = (1 << 31) - 1
OPS = ops.in_group("GEMM")           # MatMul, Gemm, FusedMatMul, Einsum: cuBLAS
BF16_OPS = ("MatMul", "Gemm", "FusedMatMul")  # (cuBLAS; CuPy's einsum has no bfloat16)
# pooling and ConvTranspose: CuPy 14 has no cuDNN (Conv runs as im2col + cuBLAS: conv.py)
NO_CUDNN = ops.in_group("WINDOW") - {"Conv"}

# A step reads and writes device arrays by buffer id: step(arrays)
Step = Callable[[list], None]


def supported(op: str) -> str | None:
    """None when this backend runs library op `op`, else why not (FusedAttention, made by
    passes/attention.py, runs as a kernel of the module: attention.py; Conv as im2col and
    cuBLAS, or in onnxruntime, by timing: conv.py)."""
    if op in OPS or op in (attn.OP, "Conv") or custom.for_call(op) is not None:
        return None
    if op in NO_CUDNN:
        return f"{op} needs cuDNN, which CuPy 14 no longer binds"
    return f"{op} is not a library call of the GPU backend"


def compute_type(dtype: str, allow_tf32: bool) -> int:
    """cublasComputeType_t of a GEMM whose operands are `dtype`."""
    if dtype == "float64":
        return COMPUTE_64F
    if dtype in ("float16", "bfloat16"):
        return COMPUTE_32F
    return COMPUTE_32F_FAST_TF32 if allow_tf32 else COMPUTE_32F


def make_step(t: kir.LibraryCall, buffers: dict[int, kir.Buffer], allow_tf32: bool
              ) -> tuple[Step, str]:
    """(step, why a CUDA graph cannot capture it: '' when it can) for one LibraryCall;
    CompileError when it cannot run here."""
    why = supported(t.op)
    if why is not None:
        raise CompileError(f"{', '.join(t.nodes)}: {why}")
    op = custom.for_call(t.op)
    if op is not None:
        return _custom_step(op, t), f"custom op {t.op}: its GPU kernel may synchronize"
    attrs = dict(t.attrs)
    ins = [None if b is None else buffers[b] for b in t.inputs]
    out = buffers[t.outputs[0]]
    if t.op == "Einsum":
        return _einsum(t, attrs), "Einsum runs through cupy.einsum, which allocates"
    if out.dtype not in CUDA_R:
        return _cupy_matmul(t), "an integer MatMul runs through cupy.matmul, which allocates"
    if t.op == "Gemm":
        plan = gemm.plan_gemm(ins[0].shape, ins[1].shape, bool(attrs.get("transA", 0)),
                              bool(attrs.get("transB", 0)))
        alpha = float(attrs.get("alpha", 1.0))
        beta = float(attrs.get("beta", 1.0)) if len(ins) > 2 and ins[2] is not None else 0.0
    else:
        trans = t.op == "FusedMatMul"
        plan = gemm.plan_matmul(ins[0].shape, ins[1].shape,
                                trans and bool(attrs.get("transA", 0)),
                                trans and bool(attrs.get("transB", 0)))
        alpha = float(attrs.get("alpha", 1.0)) if trans else 1.0
        beta = 0.0
    if tuple(plan.out_shape) != tuple(out.shape):
        raise CompileError(f"{t.op} ({', '.join(t.nodes)}): planned output "
                           f"{plan.out_shape}, buffer {out.shape}")
    _check_int32(t, plan)
    from autoclust.backends.gpu import blas
    lib = blas.get()
    if beta:
        step = _bias_epilogue(t, plan, ins, out.dtype, alpha, beta, allow_tf32, lib)
        if step is not None:
            return step, ""
        if out.dtype == "bfloat16":
            raise CompileError(f"Gemm ({', '.join(t.nodes)}): a bfloat16 C input that is "
                               "no bias row (CuPy cannot scale bfloat16 into the output)")
    return (_cublas_step(t, plan, out.dtype, alpha, beta, allow_tf32, lib),
            "" if lib is not None else blas.WRAPPER)


def _bias_epilogue(t: kir.LibraryCall, plan: gemm.GemmPlan, ins: list, dtype: str,
                   alpha: float, beta: float, allow_tf32: bool, lib: Any) -> Step | None:
    """A Gemm whose C is a bias row ([N] or [1, N], beta 1) as one cuBLASLt matmul with
    the BIAS epilogue (no pre-fill kernel); None where that does not apply or cuBLASLt
    offers no algorithm."""
    from autoclust.backends.gpu import blaslt, device
    c = ins[2]
    n = plan.out_shape[-1] if plan.out_shape else 0
    if (beta != 1.0 or lib is None or len(plan.calls) != 1 or plan.calls[0].batch != 1
            or c.dtype != dtype or tuple(c.shape) not in ((n,), (1, n))):
        return None
    lt = blaslt.get()
    call = plan.calls[0]
    lt_plan = None if lt is None else lt.plan(call, CUDA_R[dtype], compute_type(dtype, allow_tf32),
                                              CUDA_R["float64" if dtype == "float64"
                                                     else "float32"], blaslt.BIAS)
    if lt_plan is None:
        return None
    cp = device.cupy()
    scalar = np.float64 if dtype == "float64" else np.float32
    alpha_h, zero_h = np.array([alpha], scalar), np.array([0.0], scalar)
    size = np.dtype(device.host_dtype(dtype)).itemsize
    x_id, y_id, c_id, out_id = t.inputs[0], t.inputs[1], t.inputs[2], t.outputs[0]

    def step(arrays: list) -> None:
        stream = cp.cuda.get_current_stream().ptr
        out = arrays[out_id].data.ptr
        lt.matmul(lt_plan, alpha_h.ctypes.data, arrays[y_id].data.ptr + call.y_off * size,
                  arrays[x_id].data.ptr + call.x_off * size, zero_h.ctypes.data, out,
                  arrays[c_id].data.ptr, lib.workspace(stream).data.ptr, stream)

    return step


def _check_int32(t: kir.LibraryCall, plan: gemm.GemmPlan) -> None:
    for c in plan.calls:
        if max(c.m, c.n, c.k, c.lda, c.ldb, c.ldc, c.batch) > INT32_MAX:
            raise CompileError(f"{t.op} ({', '.join(t.nodes)}): a dimension exceeds cuBLAS's "
                               "32-bit limit")


def gemm_launcher(plan: gemm.GemmPlan, dtype: str, alpha: float, beta: float,
                  allow_tf32: bool, lib: Any) -> Callable[[int, int, int], None]:
    """launch(x_ptr, y_ptr, c_ptr): the GEMM calls of `plan` on the current stream, C =
    alpha * X @ Y + beta * C, through blas.Blas `lib` (capturable) or, when it is None,
    CuPy's cuBLAS wrapper."""
    from autoclust.backends.gpu import device
    cp = device.cupy()
    if lib is None:  # the package attribute: it runs CuPy's library-loading hook
        from cupy_backends.cuda.libs import cublas
    scalar = np.float64 if dtype == "float64" else np.float32
    alpha_h, beta_h = np.array([alpha], scalar), np.array([beta], scalar)
    size = np.dtype(device.host_dtype(dtype)).itemsize
    dt, comp = CUDA_R[dtype], compute_type(dtype, allow_tf32)

    def launch(xp: int, yp: int, cptr: int) -> None:
        if lib is not None:
            handle, call = lib.handle(cp.cuda.get_current_stream().ptr), \
                lib.gemm_strided_batched_ex
        else:
            handle, call = cp.cuda.device.get_cublas_handle(), cublas.gemmStridedBatchedEx
            cublas.setPointerMode(handle, POINTER_MODE_HOST)
        for c in plan.calls:
            call(
                handle, c.transa, c.transb, c.m, c.n, c.k, alpha_h.ctypes.data,
                yp + c.y_off * size, dt, c.lda, c.stride_a,
                xp + c.x_off * size, dt, c.ldb, c.stride_b,
                beta_h.ctypes.data, cptr + c.c_off * size, dt, c.ldc, c.stride_c,
                c.batch, comp, GEMM_DEFAULT)

    return launch


def _cublas_step(t: kir.LibraryCall, plan: gemm.GemmPlan, dtype: str, alpha: float,
                 beta: float, allow_tf32: bool, lib: Any) -> Step:
    """A MatMul/Gemm/FusedMatMul: its planned GEMM calls (gemm_launcher), after the
    pre-fill of the output with beta * C when the Gemm has a C."""
    from autoclust.backends.gpu import device
    cp = device.cupy()
    x_id, y_id = t.inputs[0], t.inputs[1]
    c_id = t.inputs[2] if len(t.inputs) > 2 else None
    out_id = t.outputs[0]
    prefill = c_id is not None and beta != 0.0
    launch = gemm_launcher(plan, dtype, alpha, 1.0 if prefill else 0.0, allow_tf32, lib)

    def step(arrays: list) -> None:
        y = arrays[out_id]
        if plan.k == 0 or not plan.calls:
            y.fill(0)
        if prefill:  # Y = beta * C (broadcast), then Y += alpha * A @ B
            cp.multiply(arrays[c_id], beta, out=y)
        if plan.k != 0:
            launch(arrays[x_id].data.ptr, arrays[y_id].data.ptr, y.data.ptr)

    return step


def _cupy_matmul(t: kir.LibraryCall) -> Step:
    """Integer MatMul: cuBLAS has no int32/int64 GEMM; CuPy's own kernel (wrapping)."""
    if t.op != "MatMul":
        raise CompileError(f"{t.op} ({', '.join(t.nodes)}) on integers")
    from autoclust.backends.gpu import device
    cp = device.cupy()
    a, b, out = t.inputs[0], t.inputs[1], t.outputs[0]

    def step(arrays: list) -> None:
        arrays[out][...] = cp.matmul(arrays[a], arrays[b])

    return step


def _einsum(t: kir.LibraryCall, attrs: dict[str, Any]) -> Step:
    from autoclust.backends.gpu import device
    cp = device.cupy()
    equation = attrs["equation"]
    equation = equation.decode() if isinstance(equation, bytes) else str(equation)
    ins, out = t.inputs, t.outputs[0]

    def step(arrays: list) -> None:
        arrays[out][...] = cp.einsum(equation, *[arrays[b] for b in ins])

    return step


def _custom_step(op: custom.CustomOp, t: kir.LibraryCall) -> Step:
    """A custom op (autoclust.ops.custom): its gpu_kernel on device pointers (a C function) or
    CuPy arrays (a Python function); without one, its host kernel on copies. Not
    capturable: the host path synchronizes, and a user's launches are not ours to vouch for."""
    node = t.nodes[0] if t.nodes else ""
    attrs = dict(t.attrs)
    ins, outs = t.inputs, t.outputs
    gpu = op.gpu_kernel
    from autoclust.backends.gpu import device
    cp = device.cupy()
    if isinstance(gpu, custom.C_KERNEL):
        call = custom.CCall(op, node, gpu)

        def c_step(arrays: list) -> None:
            # a C function may launch on any stream or touch the memory itself: our work
            # before it finishes first, and its work before ours continues
            cp.cuda.get_current_stream().synchronize()
            call([None if b is None else arrays[b] for b in ins], [arrays[b] for b in outs])
            cp.cuda.Device().synchronize()

        return c_step
    if gpu is not None:
        def py_step(arrays: list) -> None:
            try:
                gpu([None if b is None else arrays[b] for b in ins],
                    [arrays[b] for b in outs], dict(attrs))
            except Exception as exc:
                raise custom.KernelError(f"{op.where(node)}: gpu_kernel raised "
                                         f"{type(exc).__name__}: {exc}") from exc

        return py_step

    def host_step(arrays: list) -> None:  # copies in, the host kernel, copies out
        host_in = [None if b is None else np.ascontiguousarray(cp.asnumpy(arrays[b]))
                   for b in ins]
        host_out = [np.empty(arrays[b].shape, arrays[b].dtype) for b in outs]
        custom.call_into(op, host_in, host_out, attrs, node)
        for b, y in zip(outs, host_out):
            arrays[b][...] = cp.asarray(y)

    return host_step
