"""LLVM set-up, optimization and object code: the only module that drives llvmlite's JIT.

All LLVM calls hold LLVM_LOCK. A cluster's kernels live in one module and one MCJIT
engine (MCJIT never frees code). Object code goes through the persistent cache when
--cache_dir is set, so a warm process compiles nothing.
"""

from __future__ import annotations

import ctypes.util
import threading
from collections.abc import Callable

import llvmlite
from llvmlite import binding as llvm

from autoclust.errors import CompileError
from autoclust.runtime import disk_cache as cache
from autoclust.version import __version__, source_digest

LLVM_LOCK = threading.RLock()
COUNTS = {"compiles": 0}
# kernel code key -> (object code, .ll, .s): a kernel compiles once per process, whatever
# cluster or batch size asks for it again (a few KB per distinct kernel).
_OBJECTS: dict[str, tuple[bytes, str, str]] = {}
_STORED: set[tuple[str, str]] = set()  # (--cache_dir, key) known to hold the entry
_state: dict = {}


def target_machine() -> llvm.TargetMachine:
    """The host target machine (created once)."""
    with LLVM_LOCK:
        tm = _state.get("tm")
        if tm is None:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            llvm.initialize_native_asmparser()  # inline asm (backends/cpu/pool.py's futex)
            llvm.load_library_permanently(ctypes.util.find_library("m"))
            tm = _new_target_machine()
            _state["tm"] = tm
        return tm


def has_avx512() -> bool:
    """Whether the host has AVX-512F: 32 vector registers of 512 bits, where an AVX2 host
    has 16 of 256 (code written for the first spills on the second: gemm.py's blocks)."""
    got = _state.get("avx512")
    if got is None:
        got = _state["avx512"] = "+avx512f" in llvm.get_host_cpu_features().flatten().split(",")
    return got


def _new_target_machine() -> llvm.TargetMachine:
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                        features=llvm.get_host_cpu_features().flatten(),
                                        opt=3, jit=True)


def version_key() -> str:
    """Everything besides the IR that changes object code. Kernels key by their kernel IR
    (share_code), not by the LLVM IR codegen makes of it, so the sources' digest stands
    for codegen's version: without it a --cache_dir kept serving the object code an
    earlier codegen made."""
    return "|".join([__version__, source_digest(), llvmlite.__version__,
                     ".".join(map(str, llvm.llvm_version_info)), llvm.get_host_cpu_name(),
                     llvm.get_host_cpu_features().flatten()])


def optimize(ir_text: str, loop_passes: bool = True) -> llvm.ModuleRef:
    """Parse and optimize LLVM IR at speed level 3 with vectorization on; `loop_passes`
    False: without LLVM's vectorizers, unrolling and interleaving, for code vectorized by
    hand whose loops run run-time trip counts (gemm.py's dynamic products: 3x smaller
    code, a third of the compile time and faster, measured)."""
    tm = target_machine()
    with LLVM_LOCK:
        mod = llvm.parse_assembly(ir_text)
        mod.triple = tm.triple
        mod.data_layout = str(tm.target_data)
        mod.verify()
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pto.loop_vectorization = loop_passes
        pto.slp_vectorization = loop_passes
        pto.loop_unrolling = loop_passes
        pto.loop_interleaving = loop_passes
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
        return mod


def compile_object(ir_text: str, cache_dir: str, want_asm: bool) -> tuple[bytes, str, str]:
    """(object code, optimized .ll, .s) for a module, through the persistent cache."""
    if not cache.usable(cache_dir):
        return _compile(ir_text, want_asm)
    key = cache.make_key(ir_text, version_key())
    with cache.locked(cache_dir, key):  # one process compiles; the others wait, then load
        obj = cache.load(cache_dir, key)
        if obj is not None:
            note = f"; loaded from the persistent cache, key {key}\n"
            return obj, note, note
        built = _compile(ir_text, want_asm)
        cache.store(cache_dir, key, built[0])
    return built


def _compile(ir_text: str, want_asm: bool, loop_passes: bool = True
             ) -> tuple[bytes, str, str]:
    mod = optimize(ir_text, loop_passes)
    tm = target_machine()
    with LLVM_LOCK:
        COUNTS["compiles"] += 1
        obj = tm.emit_object(mod)
        asm = tm.emit_assembly(mod) if want_asm else ""
        ll = str(mod)
    return obj, ll, asm


def kernel_object(key: str, build: Callable[[], str], cache_dir: str,
                  want_asm: bool, loop_passes: bool = True) -> tuple[bytes, str, str]:
    """(object code, .ll, .s) of one kernel's module, by its code key.

    Looks in this process's memory, then in --cache_dir, and only then calls build() for
    the LLVM IR text and compiles it. `key` must determine the module's code (see
    share_code); checking it first skips building the IR as well as compiling it. Of
    several processes missing the same entry, one compiles it and the others load it.
    """
    hit = _OBJECTS.get(key)
    if hit is not None and (hit[2] or not want_asm):
        if cache.usable(cache_dir) and (cache_dir, key) not in _STORED:
            # compiled earlier without this --cache_dir: fill it, so the next process is warm
            _STORED.add((cache_dir, key))
            if not cache.contains(cache_dir, key):
                cache.store(cache_dir, key, hit[0])
        return hit
    if not cache.usable(cache_dir):
        _OBJECTS[key] = _compile(build(), want_asm, loop_passes)
        return _OBJECTS[key]
    with cache.locked(cache_dir, key):
        obj = cache.load(cache_dir, key)
        if obj is not None:
            note = f"; loaded from the persistent cache, key {key}\n"
            _OBJECTS[key] = (obj, note, note)
        else:
            _OBJECTS[key] = _compile(build(), want_asm, loop_passes)
            cache.store(cache_dir, key, _OBJECTS[key][0])
    _STORED.add((cache_dir, key))
    return _OBJECTS[key]


def load_object(obj: bytes | list[bytes], names: list[str]
                ) -> tuple[llvm.ExecutionEngine, dict[str, int]]:
    """An MCJIT engine holding `obj` (one object or several), and the addresses of `names`."""
    target_machine()
    with LLVM_LOCK:
        tm = _new_target_machine()  # the engine owns (and frees) its target machine
        empty = llvm.parse_assembly("")
        empty.triple = tm.triple
        engine = llvm.create_mcjit_compiler(empty, tm)
        for data in [obj] if isinstance(obj, bytes) else obj:
            engine.add_object_file(llvm.ObjectFileRef.from_data(data))
        engine.finalize_object()
        addrs = {n: engine.get_function_address(n) for n in names}
    missing = [n for n, a in addrs.items() if not a]
    if missing:
        raise CompileError(f"compiled code lacks functions {missing}")
    return engine, addrs


_DRIVER_IR = """
define void @autoclust_drive(ptr noalias %fns, ptr noalias %bufs, ptr noalias %bounds,
                             i64 %count) {
entry:
  br label %head
head:
  %i = phi i64 [ 0, %entry ], [ %next, %body ]
  %more = icmp slt i64 %i, %count
  br i1 %more, label %body, label %done
body:
  %fp = getelementptr ptr, ptr %fns, i64 %i
  %f = load ptr, ptr %fp
  %bp = getelementptr ptr, ptr %bufs, i64 %i
  %b = load ptr, ptr %bp
  %j = shl i64 %i, 1
  %sp = getelementptr i64, ptr %bounds, i64 %j
  %start = load i64, ptr %sp
  %ep = getelementptr i64, ptr %sp, i64 1
  %stop = load i64, ptr %ep
  call void %f(ptr %b, i64 %start, i64 %stop)
  %next = add i64 %i, 1
  br label %head
done:
  ret void
}
"""


def driver_address(cache_dir: str = "") -> int:
    """Address of `autoclust_drive(fns, bufs, bounds, count)`, compiled once per process
    (or loaded from `cache_dir`, the sessions' --cache_dir: compiling it took a warm
    BERT-base process's first run ~15 ms): it calls fns[i](bufs[i], bounds[2i],
    bounds[2i + 1]) for i < count."""
    with LLVM_LOCK:
        if "driver" not in _state:
            obj, _, _ = kernel_object(cache.make_key(_DRIVER_IR, version_key()),
                                      lambda: _DRIVER_IR, cache_dir, False)
            _state["driver"] = load_object(obj, ["autoclust_drive"])
        return _state["driver"][1]["autoclust_drive"]
