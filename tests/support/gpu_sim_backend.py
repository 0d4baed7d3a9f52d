"""A test device: the GPU backend's policy and C-rendered kernels, with simulated device memory.

Registered by tests as device "gpu-sim" (registry.BACKENDS). Its values are SimArray, a
wrapper that is deliberately *not* array-like: onnxruntime or NumPy code that received
one without an explicit copy would fail, so sessions on this device exercise the runtime's
host <-> device moves (runtime.DeviceRun) and count them, without a GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from autoclust.backends import gpu

from autoclust.flags import Flags
from autoclust.kernel import ir as kir
from autoclust.runtime import transfers
from support import hostsim

NAME = "gpu-sim"
POLICY = gpu.POLICY
why_not = gpu.why_not
COMPILES = []  # executables compiled in this process (tests count them)


class SimArray:
    """An array "in device memory": dtype, shape, ndim and nbytes, but no __array__."""

    def __init__(self, data: np.ndarray):
        self.data = data
        self.dtype = data.dtype
        self.shape = data.shape
        self.ndim = data.ndim
        self.nbytes = data.nbytes

    @property
    def __cuda_array_interface__(self) -> dict:  # marks a device array for the session
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (0, False)}


def is_device(x: Any) -> bool:
    return isinstance(x, SimArray)


def to_device(x: Any) -> SimArray:
    if isinstance(x, SimArray):
        return x
    a = np.asarray(x)
    transfers.count("h2d", a.nbytes)
    return SimArray(np.array(a, copy=True))


def to_host(x: Any) -> Any:
    if not isinstance(x, SimArray):
        return x
    transfers.count("d2h", x.nbytes)
    return np.array(x.data, copy=True)


class Executable:
    """hostsim's executable taking and returning SimArrays."""

    def __init__(self, inner: hostsim.Executable):
        self.inner = inner
        self.num_kernels = inner.num_kernels
        self.dumps = inner.dumps
        self.program = inner.program

    def run(self, inputs: list[Any]) -> list[SimArray]:
        # host values are uploaded (and counted), as the GPU executable does
        return [SimArray(y) for y in self.inner.run([to_device(x).data for x in inputs])]


def compile(program: kir.Program, flags: Flags) -> Executable:
    exe = Executable(hostsim.compile(program, flags))
    COMPILES.append(exe)
    return exe
