"""The CUDA device through CuPy: imported only when the GPU is asked for.

    cp = device.cupy()          # DeviceUnavailableError naming what is missing
    info = device.info()        # compute capability, multiprocessors, CUDA/CuPy versions

Moving values: `to_device(x)` takes NumPy arrays (one host-to-device copy), CuPy arrays
(as they are) and anything with DLPack on the GPU, torch CUDA tensors included (no copy);
`to_host(x)` copies device arrays back. Both count the bytes they copy into the counter
of the current run (autoclust.runtime.transfers), so `explain` can report them.

bfloat16: CuPy has no bfloat16 dtype (cupy/cupy#7527), so a bfloat16 device value is a
BF16Array: its 16 bits in a uint16 CuPy array, and the dtype (ml_dtypes.bfloat16, as the
host arrays are) carried alongside through the movers, the executables and the CUDA
graphs. Kernels and cuBLAS (CUDA_R_16BF) read the bits as they are.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import ml_dtypes
import numpy as np

from autoclust.errors import CompileError, DeviceUnavailableError
from autoclust.runtime import transfers

INSTALL_HINT = "pip install 'autoclust[gpu]' (cupy-cuda13x)"
BF16 = np.dtype(ml_dtypes.bfloat16)


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


class BF16Array:
    """A bfloat16 array in device memory: the bits (a uint16 CuPy array) and the dtype."""

    dtype = BF16

    def __init__(self, bits: Any):
        self.bits = bits

    shape = property(lambda self: self.bits.shape)
    size = property(lambda self: self.bits.size)
    ndim = property(lambda self: self.bits.ndim)
    nbytes = property(lambda self: self.bits.nbytes)
    flags = property(lambda self: self.bits.flags)
    data = property(lambda self: self.bits.data)  # kernels and cuBLAS take the bits
    __cuda_array_interface__ = property(lambda self: self.bits.__cuda_array_interface__)

    def __repr__(self) -> str:
        return f"BF16Array(shape={self.shape})"

    def reshape(self, *shape: Any) -> BF16Array:
        return BF16Array(self.bits.reshape(*shape))

    def copy(self) -> BF16Array:
        return BF16Array(self.bits.copy())

    def fill(self, value: float) -> None:
        bits = np.array(value, BF16).view(np.uint16)
        self.bits.fill(int(bits))

    def get(self) -> np.ndarray:
        return self.bits.get().view(BF16)


def host_dtype(dtype: str) -> Any:
    """The NumPy dtype of a kernel IR dtype name (bfloat16: ml_dtypes')."""
    return BF16 if dtype == "bfloat16" else np.dtype(dtype)


def empty(shape: tuple, dtype: str | np.dtype) -> Any:
    """An uninitialized device array (a BF16Array for bfloat16)."""
    cp = cupy()
    if np.dtype(host_dtype(str(dtype))) == BF16:
        return BF16Array(cp.empty(shape, dtype=cp.uint16))
    return cp.empty(shape, dtype=dtype)


def view(raw: Any, dtype: str, shape: tuple) -> Any:
    """Bytes of device memory (a uint8 CuPy array) seen as an array of dtype and shape."""
    if dtype == "bfloat16":
        return BF16Array(raw.view(cupy().uint16).reshape(shape))
    return raw.view(dtype).reshape(shape)


def copyto(dst: Any, src: Any) -> None:
    """Device-to-device copy (queued on the current stream)."""
    if isinstance(dst, BF16Array) or isinstance(src, BF16Array):
        if not (isinstance(dst, BF16Array) and isinstance(src, BF16Array)):
            raise CompileError("a bfloat16 value copied to or from another dtype on the device")
        dst, src = dst.bits, src.bits
    cupy().copyto(dst, src)


def astype(x: Any, dtype: str) -> Any:
    """x converted on the device (bfloat16 moves only as bfloat16: CuPy cannot convert)."""
    if dtype == "bfloat16" or isinstance(x, BF16Array):
        raise CompileError(f"a {x.dtype} device array where bfloat16 is expected (or the "
                           "reverse): CuPy cannot convert bfloat16 on the device")
    return x.astype(dtype)


def is_device(x: Any) -> bool:
    """Whether x is an array in GPU memory (CuPy, torch CUDA tensors, anything with the
    CUDA array interface)."""
    return type(x) is not np.ndarray and hasattr(x, "__cuda_array_interface__")


def to_device(x: Any, count: bool = True) -> Any:
    """x as a CuPy array (a BF16Array for bfloat16): NumPy arrays are copied over (and
    counted, unless count is False), device arrays are not."""
    cp = cupy()
    if isinstance(x, (cp.ndarray, BF16Array)):
        return x
    if is_device(x):
        return cp.from_dlpack(x) if hasattr(x, "__dlpack__") else cp.asarray(x)
    a = np.asarray(x)
    if count:
        transfers.count("h2d", a.nbytes)
    if a.dtype == BF16:
        return BF16Array(cp.asarray(np.ascontiguousarray(a).view(np.uint16)))
    return cp.asarray(a)


def to_host(x: Any) -> Any:
    """x as a NumPy array (device arrays are copied back; bfloat16 as ml_dtypes')."""
    if not is_device(x):
        return x
    cp = cupy()
    a = x if isinstance(x, (cp.ndarray, BF16Array)) else to_device(x)
    transfers.count("d2h", a.nbytes)
    return a.get() if isinstance(a, BF16Array) else cp.asnumpy(a)
