"""The CPU backend: kernel IR -> LLVM (llvmlite) -> an Executable.

    exe = backends.cpu.compile(program, flags)   # a Program from autoclust.compile
    outs = exe.run([x, y])

Rendering only: every distinct kernel code (Program.sharing) becomes one LLVM function
(codegen.build_module), small MatMul/Gemm calls become generated GEMM functions
(gemm.py), all compiled to object code through the in-process and --cache_dir caches
(jit); the Executable binds buffers, runs Check thunks, the remaining library calls
(library.py: MLAS or NumPy BLAS) and kernels, runs consecutive native steps through one
driver call, and splits large kernels over threads.
"""

from __future__ import annotations

import dataclasses
import os

from autoclust.backends.cpu import (
    attention,
    choice,
    codegen,
    dwconv,
    gemm,
    inplace,
    jit,
    library,
    pool,
)
from autoclust.backends.cpu.executable import Arena, Executable
from llvmlite import ir

from autoclust import ops, symbolic
from autoclust.errors import CompileError
from autoclust.flags import Flags
from autoclust.ir import Graph, Node
from autoclust.kernel import ir as kir
from autoclust.kernel.bounds import check_program
from autoclust.kernel.passes import code_key, distinct_kernels
from autoclust.passes import patchify
from autoclust.registry import Policy
from autoclust.report.lazy_dumps import LazyDumps
from autoclust.runtime import disk_cache as cache

NAME = "cpu"


def _takes_conv(node: Node) -> bool:
    """The Convs the CPU takes from onnxruntime after all: depthwise ones (generated code,
    dwconv.py) and those whose windows tile their input (a MatMul over the patches,
    passes/patchify.py), which onnxruntime ran as segments of their own between clusters."""
    return dwconv.eligible(node) or patchify.eligible(node)


# onnxruntime's Conv and pooling kernels keep the blocked NCHWc layout between them and
# fuse BatchNorm, activations and residual Adds into the Conv: measured, resnet_block ran
# 0.70x of onnxruntime with these clustered (library calls), 1.0x left to onnxruntime.
# Bias Adds fold into a MatMul's Gemm call only when no loop kernel reads the sum: in a
# fused epilogue the bias is free, inside the Gemm it is an extra pass (bert_encoder 51.5
# vs 49.2 ms).
POLICY = Policy(
    leave_to_onnxruntime=ops.in_group("WINDOW"),            # Conv, ConvTranspose, pooling
    generates=_takes_conv,                                  # but depthwise and tiling Convs
    onnxruntime_epilogues=ops.in_group("CONV_EPILOGUE"),   # BatchNorm, Relu, Add, ...
    fold_bias="alone",
    library_views=frozenset({"MatMul", "FusedMatMul", "FusedAttention"}),
    library_epilogues=frozenset({"MatMul", "FusedMatMul", "Gemm"}),
    writes_over=inplace.writes_over,                        # softmax over its scores, ...
    symbolic_dims=True,
    fused_attention=attention.MAX_HEAD_DIM,                 # generated: attention.py
    attention_dtypes=("float32",),
    attention_min_keys=attention.MIN_KEYS,
    attention_symbolic=False,
)
# Kernels with at least this many loop iterations are split over `--threads` threads
# (executable.Splitter: chunks of the outer loop claimed by the caller and helper threads),
# in chunks of at least MIN_CHUNK_WORK iterations. A split costs the caller ~10 us, so the
# break-even is low: GELU on 256K floats takes ~0.35 ms on one thread.
PARALLEL_MIN_WORK = 1 << 18
MIN_CHUNK_WORK = 1 << 16
COSTLY_WEIGHT = 2  # loop iterations one exp/tanh/erf/sigmoid/... costs (see split_work)
COMPILE_COUNT = 0  # LLVM compiles in this process (a warm --cache_dir keeps it 0)

__all__ = ["COMPILE_COUNT", "NAME", "POLICY", "Executable", "Parametric", "compile", "why_not"]


def split_work(k: kir.Kernel) -> int:
    """k.work weighted by its costly primitives (exp, tanh, erf, ...: kir.COSTLY), each
    counted as COSTLY_WEIGHT loop iterations: GPT-2's tanh-GELU over [64, 3072] (196608
    elements, 230 us on one thread) and a SwiGLU product over [128, 1408] (200 us) stayed
    on one thread under the element-count rule."""
    costly = sum(1 for e in kir.kernel_exprs(k) if isinstance(e, kir.Op) and e.name in kir.COSTLY)
    return k.work * (1 + COSTLY_WEIGHT * costly)


def why_not(node: Node, graph: Graph) -> str | None:
    """None when this backend can run `node` (the op table decides lowering; library calls
    are this backend's own), else the reason it cannot."""
    d = ops.get(node.op, node.domain)
    if d is None or d.kind != ops.LIBRARY:
        return None
    return library.supported(node.op, node.attrs)


def _threads(flags: Flags) -> int:
    return flags.threads if flags.threads > 0 else (os.cpu_count() or 1)


def compile(program: kir.Program, flags: Flags) -> Executable | Parametric:
    """Render and compile a kernel IR Program into an Executable; a Program with symbolic
    dims into a Parametric, whose bind(dims) gives an Executable for their values."""
    global COMPILE_COUNT
    threads = _threads(flags)
    choice.use_cache_dir(flags.cache_dir or None)  # measured GEMM choices live there too
    pool.use_cache_dir(flags.cache_dir)  # and the native helpers' driver
    live = [k for k in kir.kernels(program.thunks) if not k.empty]
    used = {program.sharing[k.name][0] for k in live}
    kernels = [k for k in distinct_kernels(program) if k.name in used]
    units = [_kernel_unit(k, flags) for k in kernels]
    buffers = {b.id: b for b in program.buffers}
    # thunk index -> (function name, GemmSpec | DwSpec): small GEMMs and depthwise Convs
    # run generated code (by index: a binding's instantiated thunks are new objects where
    # they hold symbolic dims)
    gemms = {}
    for i, t in enumerate(program.thunks):
        spec = _generated_spec(t, buffers)
        if spec is not None:
            unit = _gemm_unit(spec)
            gemms[i] = (unit[0], spec)
            units.append(unit)
    dumps = LazyDumps()  # texts made when read (--dump_to, tests)
    engine, addrs = None, {}
    if units:
        before = jit.COUNTS["compiles"]
        engine, addrs, dumps[".ll"], dumps[".s"] = _build(units, flags)
        COMPILE_COUNT += jit.COUNTS["compiles"] - before
    if gemms:
        dumps[".kernels.txt"] = lambda: kir.format_program(program) + "generated GEMMs and Convs:\n" + \
            "".join(f"  {', '.join(program.thunks[i].nodes)}: {spec}\n"
                    for i, (_, spec) in gemms.items())
    code = Code(addrs, engine, dumps, gemms, threads, flags.check_bounds, flags.cpu_helpers,
                flags.fast_math, flags.cpu_allow_spinning,
                ("epilogues" if flags.cpu_gemm_epilogues else "plain")
                if flags.cpu_packed_gemm else "")
    if symbolic.has_syms(program.buffers) or symbolic.has_syms(kernels):
        dims = {k.name: tuple(codegen.code_dims(k)) for k in kernels}
        return Parametric(program, code, dims)
    return code.executable(program, {})


@dataclasses.dataclass
class Code:
    """What a compile made: kernel and GEMM function addresses (kept alive by `engine`)."""

    addrs: dict[str, int]
    engine: object
    dumps: LazyDumps
    gemms: dict
    threads: int
    check_bounds: bool = False
    helpers: str = "native"  # --cpu_helpers
    fast_math: bool = False  # --fast_math: approximate epilogues too (backends/cpu/epilogue.py)
    spinning: bool = False  # --cpu_allow_spinning: helpers poll between a run's splits
    # --cpu_packed_gemm, --cpu_gemm_epilogues: packed.py's GEMM among the libraries
    # ("plain"), computing epilogues too ("epilogues"), or not at all ("")
    packed_gemm: str = "epilogues"

    def executable(self, program: kir.Program, env: dict[str, int],
                   dims: dict[str, tuple[int, ...]] | None = None, arena: Arena | None = None,
                   impls: dict[int, str] | None = None) -> Executable:
        """An Executable of `program` (concrete: instantiated at `env`, the values of the
        symbolic dims) running this code; `dims`: per kernel, the values its code reads."""
        live = [k for k in kir.kernels(program.thunks) if not k.empty]
        split: dict[str, int] = {}  # kernel -> its weighted work, for those split over threads
        if self.threads > 1:
            split = {k.name: w for k in live if (w := split_work(k)) >= PARALLEL_MIN_WORK
                     and k.shape[0] > 1}
        gemms = {i: (name, symbolic.substitute(spec, env))
                 for i, (name, spec) in self.gemms.items()} if env else self.gemms
        return Executable(program, self.addrs, split, self.threads, self.engine, self.dumps,
                          library, MIN_CHUNK_WORK, gemms, self.check_bounds, dims, arena,
                          impls, self.helpers, self.fast_math, self.spinning,
                          self.packed_gemm)


class Parametric:
    """A compiled Program with symbolic dims: one code for every value of the dims.

    bind(dims) is the Executable for concrete values: the program's sizes, checks and
    library calls instantiated (no lowering, no LLVM). Executables bound from one
    Parametric share its temps' memory (grown to the largest binding) and run one at a
    time. A library call keeps the implementation chosen at the first binding (the GEMM
    choice is measured once per cluster, not per sequence length).
    """

    def __init__(self, program: kir.Program, code: Code, dims: dict[str, tuple[str, ...]]):
        self.program = program
        self.code = code
        self.dumps = code.dumps
        self.num_kernels = sum(1 for t in program.thunks if not isinstance(t, kir.Check))
        self.symbols = sorted(symbolic.symbols_of(program.buffers) |
                              {n for names in dims.values() for n in names})
        self._dims = dims  # kernel code name -> the dims it reads, in order
        self._arena = Arena()
        self._first: Executable | None = None  # whose library choices later bindings take

    def bind(self, env: dict[str, int]) -> Executable:
        """The Executable for these values of the symbolic dims."""
        missing = [n for n in self.symbols if n not in env]
        if missing:
            raise ValueError(f"no value for symbolic dims {missing}")
        # the bounds proof over this binding's sizes (lowering left it to the bindings)
        check_program(self.program, env)
        program = kir.instantiate(self.program, env)
        dims = {name: tuple(env[n] for n in self._dims[owner])
                for name, (owner, _) in program.sharing.items() if owner in self._dims}
        impls = {} if self._first is None else \
            {i: library.current_impl(fn) for i, fn in self._first.library_fns.items()}
        exe = self.code.executable(program, env, dims, self._arena, impls)
        if self._first is None:
            self._first = exe
        return exe


Unit = tuple  # (name, cache key, build() -> LLVM IR text, symbol[, LLVM's loop passes])


def _kernel_unit(k: kir.Kernel, flags: Flags) -> Unit:
    key = cache.make_key(f"{code_key(k)}|fast_math={flags.fast_math}|check_bounds="
                         f"{flags.check_bounds}", jit.version_key())
    sym = f"k_{key[:20]}"

    def build() -> str:
        renamed = dataclasses.replace(k, name=sym)
        return str(codegen.build_module([renamed], flags.fast_math, flags.check_bounds))
    return k.name, key, build, sym


def _generated_spec(t: kir.Thunk, buffers: dict
                    ) -> gemm.GemmSpec | dwconv.DwSpec | attention.AttnSpec | None:
    """The spec of a library call this backend generates code for, else None."""
    if not isinstance(t, kir.LibraryCall):
        return None
    if t.op == "Conv":
        return dwconv.spec_for(t, buffers)
    if t.op == "FusedAttention":
        spec = attention.spec_for(t, buffers)
        if spec is None and any(v is not None for v in t.views):
            # the NumPy reference would read the views' buffers as if dense
            raise CompileError(f"FusedAttention ({', '.join(t.nodes)}) reads operands in "
                               "place that its generated kernel does not take")
        return spec
    spec = gemm.spec_for(t, buffers)
    # symbolic rows are a run-time range; other symbolic sizes need a library call
    return spec if spec is not None and not symbolic.has_syms(gemm.code_spec(spec)) else None


def _gemm_unit(spec: gemm.GemmSpec | dwconv.DwSpec | attention.AttnSpec) -> Unit:
    """The unit of a generated library call: its module, code key and symbol prefix by the
    spec's kind (GEMM, depthwise Conv, attention)."""
    if isinstance(spec, attention.AttnSpec):
        mod, text, prefix, loops = attention, attention.code_key(spec), "a", True
    elif isinstance(spec, dwconv.DwSpec):
        mod, text, prefix, loops = dwconv, dwconv.code_key(spec), "d", True
    else:
        mod, text, prefix = gemm, f"gemm|{gemm.code_key(spec)}", "g"
        loops = gemm.loop_passes(spec)
    title = "autoclust_attention" if mod is attention else "autoclust_gemm"
    key = cache.make_key(text, jit.version_key())
    sym = f"{prefix}_{key[:20]}"

    def build() -> str:
        module = ir.Module(name=title)
        mod.emit(module, sym, spec)  # type: ignore[arg-type]
        return str(module)
    return sym, key, build, sym, loops


def _build(units: list[Unit], flags: Flags) -> tuple[object, dict[str, int], str, str]:
    """(engine, {name: address}, .ll, .s): one object per distinct code.

    Each unit compiles as its own module under a symbol named after its code key, so its
    object code is reusable by any cluster and any batch size (jit.kernel_object caches it
    in memory and in --cache_dir); a cluster's objects are loaded into one engine.
    """
    objs, lls, asms, symbols = [], [], [], {}
    for name, key, build, sym, *loops in units:
        if name in symbols:
            continue
        symbols[name] = sym
        obj, ll, asm = jit.kernel_object(key, build, flags.cache_dir, bool(flags.dump_to),
                                         *loops)
        objs.append(obj)
        lls.append(f"; {name}\n{ll}")
        asms.append(f"# {name}\n{asm}")
    engine, found = jit.load_object(objs, sorted(set(symbols.values())))
    addrs = {name: found[sym] for name, sym in symbols.items()}
    return engine, addrs, "\n".join(lls), "\n".join(asms)
