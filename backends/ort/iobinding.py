"""onnxruntime's IOBinding API for autoclust sessions, run through the compiled plan.

    binding = sess.io_binding()
    binding.bind_cpu_input("x", x)            # or bind_input(ptr) / bind_ortvalue_input
    binding.bind_output("y")                   # or into a buffer / a bound OrtValue
    sess.run_with_iobinding(binding)
    y = binding.copy_outputs_to_cpu()[0]

onnxruntime's own IOBinding would run a whole-model onnxruntime session and bypass the
clusters. This one records the bindings, reads bound inputs as NumPy arrays when the run
starts (so, as with onnxruntime, changing a bound array changes the next run's input),
runs the session's plan, and returns OrtValues or writes into the memory bound for an
output. CPU memory only, as autoclust computes on the CPU. Errors are onnxruntime's types
for the same mistakes (RuntimeError at bind or run time) as well as InvalidInputError.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import onnxruntime as ort
from autoclust.backends.ort import values
from onnx import helper
from onnxruntime.capi import onnxruntime_pybind11_state as _C

from autoclust import errors


def _error(message: str) -> errors.InvalidInputError:
    # onnxruntime raises RuntimeError for binding mistakes ("Failed to find NodeArg ...").
    return errors.also(errors.InvalidInputError, RuntimeError)(message)


def _dtype(element_type: Any) -> np.dtype:
    """A NumPy dtype from a NumPy type or an ONNX element type number, as onnxruntime takes."""
    if isinstance(element_type, int | np.integer) and not isinstance(element_type, bool):
        return np.dtype(helper.tensor_dtype_to_np_dtype(int(element_type)))
    return np.dtype(element_type)


def _cpu(device_type: str, what: str) -> None:
    if str(device_type).lower() != "cpu":
        raise _error(f"{what}: autoclust sessions bind CPU memory only, got device "
                     f"{device_type!r}")


def _from_pointer(ptr: int, dtype: np.dtype, shape: Any) -> np.ndarray:
    """A NumPy view of the memory at `ptr` (bound by address, as onnxruntime takes it)."""
    shape = tuple(int(d) for d in shape)
    count = int(np.prod(shape, dtype=np.int64))
    buf = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(int(ptr))
    return np.frombuffer(buf, dtype).reshape(shape)


def _write(ptr: int, nbytes: int, shape: tuple, result: np.ndarray, name: str) -> None:
    """Copy `result` into memory bound for an output, which must fit it exactly."""
    if tuple(shape) != result.shape:
        raise _error(f"output {name!r} is bound to a buffer of shape {list(shape)}, the "
                     f"result has shape {list(result.shape)}")
    data = values.packed_bytes(result)
    if data.nbytes != nbytes:
        raise _error(f"output {name!r} is bound to {nbytes} bytes, the result "
                     f"({result.dtype}) needs {data.nbytes}")
    if data.nbytes:
        ctypes.memmove(int(ptr), data.ctypes.data, data.nbytes)


class IOBinding(ort.IOBinding):
    """IOBinding for an autoclust session (an onnxruntime.IOBinding for isinstance checks;
    it keeps its bindings itself: there is no whole-model onnxruntime session under it)."""

    def __init__(self, session: Any):
        self._owner = session
        self._inputs: dict[str, Any] = {}
        self._outputs: dict[str, Any] = {}  # name -> None | OrtValue | (dtype, shape, ptr)
        self._results: list[Any] = []

    def _check_input(self, name: str) -> None:
        if name not in {i.name for i in self._owner.get_inputs()} | \
                {i.name for i in self._owner.get_overridable_initializers()}:
            raise _error(f"Failed to find NodeArg with name: {name} in the def list "
                         f"(the model's inputs are: "
                         f"{', '.join(i.name for i in self._owner.get_inputs())})")

    def bind_cpu_input(self, name: str, arr_on_cpu: Any) -> None:
        """Bind an input to a NumPy array (read when each run starts)."""
        self._check_input(name)
        self._inputs[name] = arr_on_cpu

    def bind_input(self, name: str, device_type: str, device_id: int, element_type: Any,
                   shape: Any, buffer_ptr: int) -> None:
        """Bind an input to CPU memory at `buffer_ptr` holding `shape` of `element_type`."""
        self._check_input(name)
        _cpu(device_type, f"input {name!r}")
        self._inputs[name] = _from_pointer(buffer_ptr, _dtype(element_type), shape)

    def bind_ortvalue_input(self, name: str, ortvalue: ort.OrtValue) -> None:
        """Bind an input to an OrtValue (its current contents at each run)."""
        self._check_input(name)
        self._inputs[name] = ortvalue

    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0,
                    element_type: Any = None, shape: Any = None,
                    buffer_ptr: int | None = None) -> None:
        """Bind an output: a new OrtValue per run, or written into memory at buffer_ptr."""
        _cpu(device_type, f"output {name!r}")
        if buffer_ptr is None:
            self._outputs[name] = None
            return
        if element_type is None or shape is None:
            raise ValueError("`element_type` and `shape` are to be provided if pre-allocated "
                             "memory is provided")
        self._outputs[name] = (_dtype(element_type), tuple(int(d) for d in shape),
                               int(buffer_ptr))

    def bind_ortvalue_output(self, name: str, ortvalue: ort.OrtValue) -> None:
        """Bind an output to an OrtValue the result is written into."""
        self._outputs[name] = ortvalue

    def synchronize_inputs(self) -> None:
        """Nothing to wait for: the memory is the CPU's."""

    def synchronize_outputs(self) -> None:
        """Nothing to wait for: the memory is the CPU's."""

    def get_outputs(self) -> list[ort.OrtValue]:
        """The last run's outputs as OrtValues, in the order they were bound."""
        return list(self._results)

    def get_outputs_as_ortvaluevector(self) -> Any:
        """The last run's outputs as onnxruntime's OrtValueVector."""
        vector = _C.OrtValueVector()
        for v in self._results:
            vector.push_back(v._get_c_value())
        return vector

    def copy_outputs_to_cpu(self) -> list[Any]:
        """The last run's outputs as NumPy arrays."""
        return [values.from_ort_value(v) for v in self._results]

    def clear_binding_inputs(self) -> None:
        """Forget every bound input."""
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        """Forget every bound output."""
        self._outputs.clear()

    def _feeds(self) -> dict[str, Any]:
        return {name: values.from_ort_value(v) for name, v in self._inputs.items()}

    def _store(self, names: list[str], results: list[Any]) -> None:
        stored = []
        for name, result in zip(names, results):
            target = self._outputs[name]
            if target is None:
                stored.append(values.to_ort_value(np.ascontiguousarray(result)))
            elif isinstance(target, ort.OrtValue):
                _write(target.data_ptr(), target.tensor_size_in_bytes(),
                       tuple(target.shape()), np.asarray(result), name)
                stored.append(target)
            else:
                dtype, shape, ptr = target
                result = np.asarray(result)
                if result.dtype != dtype:
                    raise _error(f"output {name!r} is bound as {dtype}, the result is "
                                 f"{result.dtype}")
                _write(ptr, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, shape,
                       result, name)
                stored.append(values.to_ort_value(_from_pointer(ptr, dtype, shape)))
        self._results = stored


def run(session: Any, binding: Any, run_options: Any = None) -> None:
    """session.run_with_iobinding(binding): the plan on the bound inputs, into the bound
    outputs."""
    if not isinstance(binding, IOBinding) or binding._owner is not session:
        raise ValueError("IOBinding must be used with the session that created it.")
    names = list(binding._outputs)
    if not names:
        raise _error("Error in execution: At least one output should be requested.")
    try:
        results = session.run(names, binding._feeds(), run_options)
    except errors.InvalidInputError as exc:
        raise _error(f"Error in execution: {exc}") from None
    binding._store(names, results)
