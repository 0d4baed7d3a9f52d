"""The GPU renderer's kernels compiled as plain C for the host: testing without a GPU.

    exe = hostsim.compile(program, flags)      # gcc + ctypes; same API as the CPU backend
    outs = exe.run([x, y])

`render_program(program, "c")` renders the very kernel bodies the CUDA target gets (the
same expression table, index maps, reduction combines, NaN rules and vector path), with
host loops standing in for the launch: elementwise, vector and scan kernels run their
grid-stride loops over an emulated grid (deliberately small, so the stride and tail code
runs), row kernels emulate their lanes. Checks run their rendered kernels and raise
InvalidInputError; library calls go to the CPU backend's library (NumPy / MLAS). Comparing
this executable with onnxruntime proves the expression and index logic of the GPU code.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading

import numpy as np
from autoclust.backends.gpu import source, split
from autoclust.backends.gpu.launch import choose

from autoclust.errors import CompileError, InvalidInputError
from autoclust.flags import Flags
from autoclust.kernel import ir as kir

GRID = 3          # emulated blocks: small, so every thread strides over several items
CC = os.environ.get("CC", "gcc")


def _host_has_fma() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " fma " in f" {line.split(':', 1)[-1]} "
                       for line in f)
    except OSError:
        return False


# NVRTC compiles with --fmad=true: a multiply feeding an add becomes one fused multiply-add
# (one rounding). gcc does the same with FMA instructions and -ffp-contract=fast, so the
# host rendering rounds as the GPU does; without FMA on this CPU it cannot (CONTRACTS False:
# tests that need it skip).
CONTRACTS = _host_has_fma()
CONTRACT_FLAGS = ["-mfma", "-ffp-contract=fast", "-fexpensive-optimizations"] if CONTRACTS else ["-ffp-contract=off"]
_LIBS: dict[str, ctypes.CDLL] = {}
_LOCK = threading.Lock()
_DIR = tempfile.mkdtemp(prefix="autoclust_hostsim_")
# removed at exit (the libraries stay mapped until then): each test process left ~1 MB
# of C and .so files behind, 180 MB in /tmp after a few days of runs
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)


def build(src: str) -> ctypes.CDLL:
    """Compile C source into a shared library (cached by source text in this process)."""
    key = hashlib.sha256(src.encode()).hexdigest()[:24]
    with _LOCK:
        lib = _LIBS.get(key)
        if lib is not None:
            return lib
        c_path = os.path.join(_DIR, f"{key}.c")
        so_path = os.path.join(_DIR, f"{key}.so")
        with open(c_path, "w") as f:
            f.write(src)
        # no -ffast-math: IEEE float semantics; FMA contraction as NVRTC's --fmad=true
        cmd = [CC, "-O1", "-std=gnu11", "-fPIC", "-shared", "-w", *CONTRACT_FLAGS, c_path,
               "-o", so_path, "-lm"]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise CompileError(f"gcc failed on the C rendering ({c_path}):\n"
                               f"{proc.stderr[-4000:]}")
        lib = ctypes.CDLL(so_path)
        _LIBS[key] = lib
        return lib


class Executable:
    """run(inputs) -> outputs: the C rendering of a Program, on NumPy arrays."""

    def __init__(self, program: kir.Program, rendered: source.Rendered, lib: ctypes.CDLL):
        self.program = program
        self.rendered = rendered
        self.lib = lib
        self.dumps = {".kernels.txt": kir.format_program(program)
                      + rendered.launch_text(program)}
        self.num_kernels = sum(1 for t in program.thunks if not isinstance(t, kir.Check))
        self.buffers = {b.id: b for b in program.buffers}
        self._lock = threading.Lock()
        self._fixed = self._allocate_fixed()
        self._library = None
        # split-row workspaces: counters zeroed once here, reset by the kernels themselves
        self._workspaces = {
            t.name: np.zeros(split.workspace_bytes(t, e.launch, t.shape[0]), np.uint8)
            for t in program.thunks if isinstance(t, kir.Kernel)
            and (e := rendered.kernels[t.name]).launch.strategy == "split-row"}

    def _allocate_fixed(self) -> dict[int, np.ndarray]:
        fixed: dict[int, np.ndarray] = {}
        slot_bytes: dict[int, int] = {}
        for b in self.program.buffers:
            if b.role == "temp":
                n = b.size * np.dtype(b.dtype).itemsize
                slot_bytes[b.slot] = max(slot_bytes.get(b.slot, 0), n)
        slots = {s: np.empty(max(n, 1), np.uint8) for s, n in slot_bytes.items()}
        for b in self.program.buffers:
            if b.role == "temp":
                n = b.size * np.dtype(b.dtype).itemsize
                fixed[b.id] = slots[b.slot][:n].view(b.dtype).reshape(b.shape)
            elif b.role == "const":
                fixed[b.id] = np.array(self.program.constants[b.id], dtype=b.dtype,
                                       order="C").reshape(b.shape)
        return fixed

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        with self._lock:
            arrays = dict(self._fixed)
            for bid, x in zip(self.program.inputs, inputs):
                dtype = np.dtype(self.buffers[bid].dtype)
                if not (type(x) is np.ndarray and x.flags.c_contiguous and x.dtype == dtype):
                    x = np.array(x, dtype=dtype, order="C")  # (a misaligned view is kept)
                arrays[bid] = x
            for b in self.program.buffers:
                if b.role == "output":
                    arrays[b.id] = np.empty(b.shape, b.dtype)
            for i, t in enumerate(self.program.thunks):
                if isinstance(t, kir.Kernel):
                    self._kernel(t, arrays)
                elif isinstance(t, kir.Check):
                    self._check(i, t, arrays)
                elif i in self.rendered.calls and t.op != "Conv":  # (attention; Conv:
                    # its im2col runs through the stand-in CuPy, the CPU library here)
                    self._rendered_call(self.rendered.calls[i], arrays)
                else:
                    self._call(t, arrays)
            seen: set[int] = set()
            outs = []
            for bid in self.program.outputs:
                a = arrays[bid]
                copy = self.buffers[bid].role != "output" or bid in seen
                outs.append(np.array(a, copy=True) if copy else a)
                seen.add(bid)
            return outs

    def _kernel(self, t: kir.Kernel, arrays: dict[int, np.ndarray]) -> None:
        if t.empty:
            return
        e = self.rendered.kernels[t.name]
        n0 = t.shape[0]
        grid = min(e.launch.grid(n0, 1), GRID)
        args = [ctypes.c_void_p(arrays[b].ctypes.data) for b in e.args]
        args.append(ctypes.c_longlong(n0))
        if t.name in self._workspaces:
            args.append(ctypes.c_void_p(self._workspaces[t.name].ctypes.data))
        args += [ctypes.c_uint(grid), ctypes.c_uint(e.launch.block)]
        getattr(self.lib, e.symbol)(*args)

    def _check(self, i: int, t: kir.Check, arrays: dict[int, np.ndarray]) -> None:
        x = arrays[t.buf]
        count, start, stride = source.check_args(t, x.size)
        flags = np.zeros(1, np.int32)
        args = [ctypes.c_void_p(x.ctypes.data), ctypes.c_longlong(count),
                ctypes.c_longlong(start), ctypes.c_longlong(stride), ctypes.c_longlong(t.lo),
                ctypes.c_longlong(t.hi), ctypes.c_void_p(flags.ctypes.data), ctypes.c_int(0),
                ctypes.c_uint(GRID), ctypes.c_uint(64)]
        getattr(self.lib, self.rendered.checks[i])(*args)
        if flags[0]:
            raise InvalidInputError(t.message)

    def _rendered_call(self, e: source.CallEntry, arrays: dict[int, np.ndarray]) -> None:
        args = [ctypes.c_void_p(arrays[b].ctypes.data) for b in e.args]
        args += [ctypes.c_uint(min(e.grid(1), GRID)), ctypes.c_uint(e.block)]
        getattr(self.lib, e.symbol)(*args)

    def _call(self, t: kir.LibraryCall, arrays: dict[int, np.ndarray]) -> None:
        from autoclust.backends.cpu import library
        fn = library.make_call_for(t, self.program.buffers, 1, self.program.constants)
        fn([None if b is None else arrays[b] for b in t.inputs], [arrays[b] for b in t.outputs])


def compile(program: kir.Program, flags: Flags, choose_launch=choose) -> Executable:
    """The host-C executable of a kernel IR Program."""
    return compile_many([program], choose_launch, flags.gpu_mma_attention)[0]


def compile_many(programs: list[kir.Program], choose_launch=choose,
                 mma_attention: bool = False) -> list[Executable]:
    """Executables of several Programs built from one C module (one gcc call)."""
    rendered = [source.render_program(p, "c", choose_launch, mma_attention) for p in programs]
    lib = build(source.module_source(rendered))
    return [Executable(p, r, lib) for p, r in zip(programs, rendered)]
