"""The GPU backend: kernel IR -> CUDA C -> NVRTC (through CuPy) -> an Executable.

    exe = backends.gpu.compile(program, flags)   # needs CuPy and a CUDA GPU
    outs = exe.run([x, y])                       # CuPy arrays out
    files = backends.gpu.render(program, flags)  # {".cu", ".kernels.txt"}: no CuPy, no GPU

Rendering (source.py, kernels.py, split.py, cstyle.py, prelude.py) is plain Python; CuPy is
imported only by `compile`, `require_device` and the value movers, so the CPU path and
`autoclust compile --device gpu` never import it. Library calls (library.py): MatMul,
Gemm, FusedMatMul through cuBLAS, Einsum through CuPy. Values stay in device memory
between GPU steps (POLICY.device_memory); the runtime copies them for onnxruntime
segments. A plan whose every step runs here (cuBLAS calls included: blas.py) replays as
one CUDA graph per input signature (graphs.py, --cuda_graphs).
"""

from __future__ import annotations

from typing import Any

from autoclust.backends.gpu import attention, device, library, source
from autoclust.backends.gpu.launch import choose

from autoclust import ops
from autoclust.flags import Flags
from autoclust.ir import Graph, Node
from autoclust.kernel import ir as kir
from autoclust.registry import Policy

NAME = "gpu"
# ConvTranspose and pooling: CuPy 14 has no cuDNN (library.py), so they stay in onnxruntime
# on the host, and with them the epilogues onnxruntime fuses into them. Conv runs here (as
# im2col and cuBLAS) or in onnxruntime, decided by timing at each call site (conv.py). Bias
# Adds fold into a Gemm call only when no loop kernel reads the sum: a fused epilogue
# adds the bias for free, inside the Gemm it costs a pre-fill of the output.
POLICY = Policy(
    leave_to_onnxruntime=library.NO_CUDNN,
    onnxruntime_epilogues=ops.in_group("CONV_EPILOGUE"),
    fold_bias="alone",
    device_memory=True,
    fused_attention=attention.MAX_HEAD_DIM,
    library_dtypes=frozenset({ops.BFLOAT16}),
)

to_device = device.to_device
to_host = device.to_host
is_device = device.is_device

__all__ = ["NAME", "POLICY", "capture", "compile", "compile_many", "is_device", "render", "require_device",
           "to_device", "to_host", "why_not"]


def why_not(node: Node, graph: Graph) -> str | None:
    """None when this backend can run `node`. Conv and pooling are refused (no cuDNN in
    CuPy 14), so --must_compile names them at clustering; POLICY leaves them, and the
    epilogues onnxruntime fuses into them, to onnxruntime. bfloat16 and int8/uint8/int16/
    uint16 render as on the CPU (float32 / int32 math); which ops take them is the op
    table's `compiled_dtypes`, plus bfloat16 GEMMs (POLICY.library_dtypes: cuBLAS
    CUDA_R_16BF with float32 accumulation)."""
    d = ops.get(node.op, node.domain)
    if d is None or d.kind != ops.LIBRARY:
        return None
    if node.op == "Conv" and node.inputs[0].shape is not None \
            and len(node.inputs[0].shape) not in (3, 4):
        return f"{len(node.inputs[0].shape) - 2}-D Conv: only 1-D and 2-D Conv run on the GPU"
    if node.op not in library.BF16_OPS and any(
            v is not None and v.dtype == ops.BFLOAT16 for v in node.inputs + node.outputs):
        return f"bfloat16 {node.op}: only cuBLAS GEMMs take bfloat16 (CuPy has no bfloat16)"
    return library.supported(node.op)


def require_device() -> None:
    """DeviceUnavailableError naming what is missing (CuPy, a GPU) on this machine."""
    device.cupy()


def _launch_text(program: kir.Program, rendered: source.Rendered) -> str:
    return kir.format_program(program) + rendered.launch_text(program)


def render(program: kir.Program, flags: Flags) -> dict[str, str]:
    """The CUDA C of a Program and its launches, without CuPy or a GPU."""
    rendered = source.render_program(program, "cuda", mma_attention=flags.gpu_mma_attention)
    return {".cu": rendered.source, ".kernels.txt": _launch_text(program, rendered)}


def compile(program: kir.Program, flags: Flags) -> Any:
    """Render, compile with NVRTC for this device, and bind a Program's buffers."""
    return compile_many([program], flags)[0]


def compile_many(programs: list[kir.Program], flags: Flags,
                 choose_launch: Any = choose) -> list[Any]:
    """Executables of several Programs sharing one module (one NVRTC compile); tests pass
    choose_launch to force launch strategies."""
    from autoclust.backends.gpu import nvrtc
    from autoclust.backends.gpu.executable import Executable
    device.cupy()
    rendered = [source.render_program(p, "cuda", choose_launch, flags.gpu_mma_attention)
                for p in programs]
    text = source.module_source(rendered)
    # calls rendered as kernels (fused attention) live in the module too: a cluster of one
    # attention call still needs it loaded
    needs_code = any(r.kernels or r.checks or r.calls for r in rendered)
    module = nvrtc.load(text, flags.cache_dir) if needs_code else None
    ptx = ""
    if flags.dump_to and needs_code:
        ptx = nvrtc.compile_source(text, "ptx").decode(errors="replace")
    out = []
    for p, r in zip(programs, rendered):
        exe = Executable(p, r, module, flags.allow_tf32)
        exe.dumps = {".cu": text, ".kernels.txt": _launch_text(p, r)}
        if ptx:
            exe.dumps[".ptx"] = ptx
        out.append(exe)
    return out


def capture(runtime: Any) -> Any:
    """A whole-run CUDA graph replayer for `runtime` (None when --cuda_graphs is off)."""
    if not runtime.flags.cuda_graphs:
        return None
    from autoclust.backends.gpu.graphs import GraphRunner
    return GraphRunner(runtime)
