"""CUDA C -> a loaded module: NVRTC (through CuPy's binding) for the device's architecture,
with an in-process cache and the `--cache_dir` cache keyed by source, architecture, CUDA,
NVRTC and CuPy versions.

Not CuPy's RawModule: its compile path adds `-ftz=true`, which flushes float32 denormals
to zero; our kernels keep IEEE denormals like the CPU backend and onnxruntime. The options
are NVRTC's defaults otherwise (`--fmad=true`, precise division and sqrt).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from typing import Any

from autoclust.backends.gpu import device

from autoclust.errors import CompileError

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
    """The loaded cupy.cuda.function.Module of `source` (compiled at most once)."""
    cp = device.cupy()
    key = cache_key(source)
    with _LOCK:
        mod = _MODULES.get(key)
        if mod is not None:
            return mod
        cubin = _read_cache(cache_dir, key)
        if cubin is None:
            cubin = compile_source(source)
            COUNTS["compiles"] += 1
            _write_cache(cache_dir, key, cubin)
        else:
            COUNTS["disk_hits"] += 1
        mod = cp.cuda.function.Module()
        mod.load(cubin)
        _MODULES[key] = mod
        return mod


def _path(cache_dir: str, key: str) -> str:
    return os.path.join(cache_dir, "gpu", f"{key}.cubin")


def _read_cache(cache_dir: str, key: str) -> bytes | None:
    """A cached cubin; the file's last 64 bytes are the sha256 of the rest (a truncated or
    corrupted entry is ignored and rebuilt)."""
    if not cache_dir:
        return None
    try:
        with open(_path(cache_dir, key), "rb") as f:
            data = f.read()
    except OSError:
        return None
    body, digest = data[:-64], data[-64:]
    if hashlib.sha256(body).hexdigest().encode() != digest:
        return None
    return body


def _write_cache(cache_dir: str, key: str, cubin: bytes) -> None:
    if not cache_dir:
        return
    path = _path(cache_dir, key)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
        with os.fdopen(fd, "wb") as f:
            f.write(cubin + hashlib.sha256(cubin).hexdigest().encode())
        os.replace(tmp, path)
    except OSError:  # an unwritable cache must not break compiling
        pass
