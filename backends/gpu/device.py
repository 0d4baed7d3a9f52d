"""The CUDA device through CuPy: imported only when the GPU is asked for.

    cp = device.cupy()          # DeviceUnavailableError naming what is missing
    info = device.info()        # compute capability, multiprocessors, CUDA/CuPy versions

Moving values: `to_device(x)` takes NumPy arrays (one host-to-device copy), CuPy arrays
(as they are) and anything with DLPack on the GPU, torch CUDA tensors included (no copy);
`to_host(x)` copies device arrays back. Both count the bytes they copy into the counter
of the current run (autoclust.runtime.transfers), so `explain` can report them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from autoclust.errors import DeviceUnavailableError
from autoclust.runtime import transfers

INSTALL_HINT = "pip install 'autoclust[gpu]' (cupy-cuda13x)"


@functools.lru_cache(maxsize=1)
def _import() -> tuple[Any, str]:
    """(cupy module or None, the reason it is unusable or '')."""
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken CUDA install
        return None, (f"device 'gpu' needs CuPy, which could not be imported ({exc}); "
                      f"{INSTALL_HINT}")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - cudaErrorNoDevice, driver missing, ...
        return None, f"device 'gpu': CuPy {cupy.__version__} found no CUDA GPU ({exc})"
    if count < 1:
        return None, f"device 'gpu': CuPy {cupy.__version__} found no CUDA GPU"
    return cupy, ""


def available() -> str:
    """'' when a GPU is usable here, else the reason (what is missing)."""
    return _import()[1]


def cupy() -> Any:
    """The cupy module; DeviceUnavailableError when CuPy or a GPU is missing."""
    mod, reason = _import()
    if mod is None:
        raise DeviceUnavailableError(reason)
    return mod


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    name: str
    arch: str            # compute capability as NVRTC spells it: "90"
    sm_count: int
    cuda_runtime: int    # e.g. 13000
    nvrtc: tuple[int, int]
    cupy_version: str

    def key(self) -> str:
        """What compiled code depends on, for cache keys."""
        return (f"sm_{self.arch}|cuda={self.cuda_runtime}|nvrtc={self.nvrtc}|"
                f"cupy={self.cupy_version}")


@functools.lru_cache(maxsize=1)
def info() -> DeviceInfo:
    cp = cupy()
    from cupy_backends.cuda.libs import nvrtc
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return DeviceInfo(name, str(dev.compute_capability),
                      int(dev.attributes["MultiProcessorCount"]),
                      int(cp.cuda.runtime.runtimeGetVersion()), tuple(nvrtc.getVersion()),
                      cp.__version__)


def is_device(x: Any) -> bool:
    """Whether x is an array in GPU memory (CuPy, torch CUDA tensors, anything with the
    CUDA array interface)."""
    return type(x) is not np.ndarray and hasattr(x, "__cuda_array_interface__")


def to_device(x: Any) -> Any:
    """x as a CuPy array: NumPy arrays are copied over, device arrays are not."""
    cp = cupy()
    if isinstance(x, cp.ndarray):
        return x
    if is_device(x):
        return cp.from_dlpack(x) if hasattr(x, "__dlpack__") else cp.asarray(x)
    a = np.asarray(x)
    transfers.count("h2d", a.nbytes)
    return cp.asarray(a)


def to_host(x: Any) -> Any:
    """x as a NumPy array (device arrays are copied back)."""
    if not is_device(x):
        return x
    cp = cupy()
    a = x if isinstance(x, cp.ndarray) else to_device(x)
    transfers.count("d2h", a.nbytes)
    return cp.asnumpy(a)
