"""CUDA C -> a loaded module: NVRTC (through CuPy's binding) for the device's architecture,
with an in-process cache and the `--cache_dir` cache keyed by source, architecture, CUDA,
NVRTC and CuPy versions (entries in `autoclust/runtime/disk_cache.py`'s format: checked,
authenticated under a key, built by one process of many).

Not CuPy's RawModule: its compile path adds `-ftz=true`, which flushes float32 denormals
to zero; our kernels keep IEEE denormals like the CPU backend and onnxruntime. The options
are NVRTC's defaults otherwise (`--fmad=true`, precise division and sqrt).
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

from autoclust.backends.gpu import device

from autoclust.errors import CompileError
from autoclust.runtime import disk_cache

OPTIONS = ("--std=c++17", "--ftz=false", "--prec-div=true", "--prec-sqrt=true", "--fmad=true")
_MODULES: dict[str, Any] = {}
_LOCK = threading.Lock()
COUNTS = {"compiles": 0, "disk_hits": 0}


def cache_key(source: str, options: tuple[str, ...] = OPTIONS) -> str:
    info = device.info()
    text = f"{info.key()}|{' '.join(options)}|{source}"
    return hashlib.sha256(text.encode()).hexdigest()


def compile_source(source: str, target: str = "cubin",
                   options: tuple[str, ...] = OPTIONS) -> bytes:
    """NVRTC: source -> cubin (for this device's architecture) or PTX; CompileError with
    NVRTC's log on failure."""
    from cupy_backends.cuda.libs import nvrtc
    info = device.info()
    arch = f"-arch={'sm' if target == 'cubin' else 'compute'}_{info.arch}"
    prog = nvrtc.createProgram(source, "autoclust.cu", (), ())
    try:
        try:
            nvrtc.compileProgram(prog, list(options) + [arch])
        except Exception as exc:  # noqa: BLE001 - NVRTCError: the log says why
            log = nvrtc.getProgramLog(prog)
            raise CompileError(f"NVRTC failed ({exc}):\n{log[-4000:]}") from None
        return nvrtc.getCUBIN(prog) if target == "cubin" else nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)


def load(source: str, cache_dir: str = "") -> Any:
    """The loaded cupy.cuda.function.Module of `source` (compiled at most once; of several
    processes sharing --cache_dir, one compiles and the others load its cubin)."""
    cp = device.cupy()
    key = cache_key(source)
    with _LOCK:
        mod = _MODULES.get(key)
        if mod is not None:
            return mod
        gpu_dir = os.path.join(cache_dir, "gpu") if cache_dir else ""
        with disk_cache.locked(gpu_dir, key):
            cubin = disk_cache.load(gpu_dir, key, ".cubin")
            if cubin is None:
                cubin = compile_source(source)
                COUNTS["compiles"] += 1
                disk_cache.store(gpu_dir, key, cubin, ".cubin")
            else:
                COUNTS["disk_hits"] += 1
        mod = cp.cuda.function.Module()
        mod.load(cubin)
        _MODULES[key] = mod
        return mod
