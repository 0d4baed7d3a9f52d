"""onnxruntime's C API through ctypes, for the single-node library sessions (MLAS GEMMs,
Conv, pooling: backends/cpu/mlas.py): every one of them shares one intra-op thread pool.

Why not the Python binding: each of its sessions owns a thread pool, so a plan with 72
library GEMMs (BERT-base) wakes 72 different worker threads, one after another. The
binding can share a pool only process-wide (`set_global_thread_pool_sizes`), after which
onnxruntime refuses every session made without `use_per_session_threads = False`: the
user's own sessions too. Measured (2 threads, alternating blocks, one process each):

- a chain of 12 GEMMs ([128, 512] x [512, 2048] and back, Relu and residual Add between):
  0.91-0.93x of onnxruntime's own session with a pool each, 0.92-0.94x with the shared
  pool;
- exports: BERT-base 1.02x -> 1.07x, LLaMA-like 1.09x -> 1.12x, T5 0.97x -> 1.00x; the
  process's threads 57 -> 10 (BERT-base);
- the shared worker spinning between calls (`backends/cpu/mlas.py: SPIN`) ran our chain
  3% faster still, but it spins on after a run and took the cores from what ran next
  (onnxruntime's session: 11.9 -> 13.2-13.5 ms); each per-session worker spinning took
  the chain to 9 ms a GEMM (24 spinning threads on 2 cores).

The wheel carries two copies of onnxruntime: the binding module links one in, and
libonnxruntime.so (beside it) serves the C API. An environment made here, with its global
thread pool, lives in the second copy and leaves the user's sessions alone.

    env = capi.env(threads=2)            # None, with capi.unavailable() saying why
    sess = capi.Session(env, model_bytes, {"in1": weights})
    binding = sess.binding()
    binding.bind("in0", a, output=False); binding.bind("out0", y, output=True)
    binding.run()                        # y holds the result; the GIL is released

Function pointers are taken from `OrtApi` by index: the struct only grows at its end
(onnxruntime's ABI rule), and every index below is that of API version 13 and earlier.
`AUTOCLUST_ORT_CAPI=0` turns this module off (the binding's per-session pools serve).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnxruntime as ort

VP = ctypes.c_void_p
_INT, _SIZE, _STR = ctypes.c_int, ctypes.c_size_t, ctypes.c_char_p
API_VERSION = 13
# OrtApi member: (index, result type, argument types); index = position in the struct
_FUNCTIONS = {
    "GetErrorMessage": (2, _STR, [VP]),
    "CreateSessionFromArray": (8, VP, [VP, VP, _SIZE, VP, VP]),
    "CreateSessionOptions": (10, VP, [VP]),
    "SetSessionExecutionMode": (13, VP, [VP, _INT]),
    "SetSessionGraphOptimizationLevel": (23, VP, [VP, _INT]),
    "SetIntraOpNumThreads": (24, VP, [VP, _INT]),
    "SetInterOpNumThreads": (25, VP, [VP, _INT]),
    "CreateTensorWithDataAsOrtValue": (49, VP, [VP, VP, _SIZE, VP, _SIZE, _INT, VP]),
    "CreateCpuMemoryInfo": (69, VP, [_INT, _INT, VP]),
    "ReleaseStatus": (93, None, [VP]),
    "ReleaseSession": (95, None, [VP]),
    "ReleaseValue": (96, None, [VP]),
    "ReleaseSessionOptions": (100, None, [VP]),
    "CreateEnvWithGlobalThreadPools": (119, VP, [_INT, _STR, VP, VP]),
    "DisablePerSessionThreads": (120, VP, [VP]),
    "CreateThreadingOptions": (121, VP, [VP]),
    "ReleaseThreadingOptions": (122, None, [VP]),
    "AddSessionConfigEntry": (130, VP, [VP, _STR, _STR]),
    "RunWithBinding": (133, VP, [VP, VP, VP]),
    "CreateIoBinding": (134, VP, [VP, VP]),
    "ReleaseIoBinding": (135, None, [VP]),
    "BindInput": (136, VP, [VP, _STR, VP]),
    "BindOutput": (137, VP, [VP, _STR, VP]),
    "SetGlobalIntraOpNumThreads": (147, VP, [VP, _INT]),
    "SetGlobalInterOpNumThreads": (148, VP, [VP, _INT]),
    "SetGlobalSpinControl": (149, VP, [VP, _INT]),
    "AddExternalInitializers": (210, VP, [VP, VP, VP, _SIZE]),
}
LOG_WARNING, ORT_ENABLE_ALL, ORT_SEQUENTIAL = 2, 99, 0
ARENA_ALLOCATOR, MEM_TYPE_DEFAULT = 1, 0
# numpy dtype -> ONNXTensorElementDataType (the same numbers as onnx.TensorProto's)
_ELEMENT = {np.dtype(n): k for n, k in (
    ("float32", 1), ("uint8", 2), ("int8", 3), ("uint16", 4), ("int16", 5), ("int32", 6),
    ("int64", 7), ("bool", 9), ("float16", 10), ("float64", 11), ("uint32", 12),
    ("uint64", 13))}

_STATE: dict[str, object] = {}
_LOCK = threading.Lock()


class CApiError(RuntimeError):
    """onnxruntime returned an error status (its message), or the C API is unavailable."""


class _Base(ctypes.Structure):
    _fields_ = [("GetApi", ctypes.CFUNCTYPE(VP, ctypes.c_uint32)),
                ("GetVersionString", ctypes.CFUNCTYPE(_STR))]


def _library_path() -> str:
    capi_dir = os.path.join(os.path.dirname(ort.__file__), "capi")
    return os.path.join(capi_dir, f"libonnxruntime.so.{ort.__version__}")


def _load() -> dict[str, object]:
    """The API's functions and a CPU memory info, loaded once (under _LOCK)."""
    if "functions" in _STATE or "error" in _STATE:
        return _STATE
    try:
        if os.environ.get("AUTOCLUST_ORT_CAPI", "1") == "0":
            raise CApiError("off (AUTOCLUST_ORT_CAPI=0)")
        path = _library_path()
        if not os.path.exists(path):
            raise CApiError(f"{os.path.basename(path)} is not beside onnxruntime's binding")
        lib = ctypes.CDLL(path)
        lib.OrtGetApiBase.restype = ctypes.POINTER(_Base)
        base = lib.OrtGetApiBase().contents
        version = base.GetVersionString().decode()
        if version != ort.__version__:
            raise CApiError(f"libonnxruntime {version} differs from the binding's {ort.__version__}")
        table = ctypes.cast(base.GetApi(API_VERSION), ctypes.POINTER(VP))
        if not table:
            raise CApiError(f"libonnxruntime {version} has no C API version {API_VERSION}")
        functions = {name: ctypes.CFUNCTYPE(res, *args)(table[index])
                     for name, (index, res, args) in _FUNCTIONS.items()}
        _STATE.update(lib=lib, functions=functions)
        info = VP()
        _check(functions["CreateCpuMemoryInfo"](ARENA_ALLOCATOR, MEM_TYPE_DEFAULT,
                                                 ctypes.byref(info)))
        _STATE["memory_info"] = info
    except (OSError, AttributeError, CApiError) as exc:
        _STATE.clear()
        _STATE["error"] = str(exc)
    return _STATE


def unavailable() -> str | None:
    """Why the C API cannot serve (None: it can)."""
    with _LOCK:
        return _load().get("error") or _STATE.get("env_error")  # type: ignore[return-value]


def _f(name: str) -> Any:  # a ctypes function
    return _STATE["functions"][name]  # type: ignore[index]


def _check(status: int | None) -> None:
    if status:
        message = _f("GetErrorMessage")(status)
        _f("ReleaseStatus")(status)
        raise CApiError((message or b"").decode(errors="replace"))


class Env:
    """The process's C API environment: one global intra-op pool of `threads` threads
    (the caller and threads - 1 workers), whose worker spins between calls when `spin`."""

    def __init__(self, threads: int, spin: bool):
        self.threads, self.spin, self.pid = threads, spin, os.getpid()
        options, env = VP(), VP()
        _check(_f("CreateThreadingOptions")(ctypes.byref(options)))
        try:
            _check(_f("SetGlobalIntraOpNumThreads")(options, threads))
            _check(_f("SetGlobalInterOpNumThreads")(options, 1))
            _check(_f("SetGlobalSpinControl")(options, int(spin)))
            _check(_f("CreateEnvWithGlobalThreadPools")(LOG_WARNING, b"autoclust", options,
                                                        ctypes.byref(env)))
        finally:
            _f("ReleaseThreadingOptions")(options)
        self.handle = env  # never released: sessions of this process hold it until exit


def env(threads: int, spin: bool = False) -> Env | None:
    """The shared environment, made at the first call (onnxruntime allows one environment a
    process); None when the C API is unavailable, the environment could not be made (its
    message is kept: `unavailable()`), its pool has another thread count than `threads` or
    another spin setting than `spin`, or this process is a fork of the one that made it (its
    workers did not come along). Such sessions keep the binding's per-session pools."""
    with _LOCK:
        if _load().get("error") or _STATE.get("env_error"):
            return None
        made = _STATE.get("env")
        if made is None:
            try:
                made = _STATE["env"] = Env(threads, spin)
            except CApiError as exc:
                _STATE["env_error"] = f"the environment could not be made: {exc}"
                return None
    if made.pid != os.getpid():  # type: ignore[union-attr]
        return None  # a forked child: the pool's threads stayed in the parent
    same = made.threads == threads and made.spin == spin  # type: ignore[union-attr]
    return made if same else None


def supports(dtypes: Iterable[np.dtype]) -> bool:
    """Whether every dtype has a tensor type here (bfloat16 and the other ml_dtypes do not:
    their sessions keep the binding's)."""
    return all(np.dtype(d) in _ELEMENT for d in dtypes)


def current() -> Env | None:
    """The environment this process made, if any."""
    with _LOCK:
        return _STATE.get("env")  # type: ignore[return-value]


def _value(array: np.ndarray) -> VP:
    """An OrtValue over `array`'s memory (C-contiguous; the caller keeps it alive)."""
    element = _ELEMENT.get(array.dtype)
    if element is None:
        raise CApiError(f"dtype {array.dtype} has no onnxruntime tensor type here")
    shape = (ctypes.c_int64 * max(array.ndim, 1))(*array.shape)
    value = VP()
    _check(_f("CreateTensorWithDataAsOrtValue")(
        _STATE["memory_info"], array.ctypes.data, array.nbytes, shape, array.ndim, element,
        ctypes.byref(value)))
    return value


class _Values:
    """OrtValues released with their owner."""

    def __init__(self):
        self.values: list[VP] = []

    def add(self, array: np.ndarray) -> VP:
        value = _value(array)
        self.values.append(value)
        return value

    def release(self) -> None:
        while self.values:
            _f("ReleaseValue")(self.values.pop())


class Session:
    """A session of `env` over a serialized model; `external` initializers (name -> array)
    are read in place (the session holds the arrays)."""

    def __init__(self, environment: Env, model: bytes, external: Mapping[str, np.ndarray]):
        self.external = dict(external)
        self._keep = _Values()
        options, handle = VP(), VP()
        _check(_f("CreateSessionOptions")(ctypes.byref(options)))
        try:
            _check(_f("DisablePerSessionThreads")(options))
            _check(_f("SetSessionGraphOptimizationLevel")(options, ORT_ENABLE_ALL))
            _check(_f("SetSessionExecutionMode")(options, ORT_SEQUENTIAL))
            if self.external:
                names = (_STR * len(self.external))(*(k.encode() for k in self.external))
                values = (VP * len(self.external))(
                    *(self._keep.add(np.ascontiguousarray(a)).value
                      for a in self.external.values()))
                _check(_f("AddExternalInitializers")(options, names, values, len(values)))
            _check(_f("CreateSessionFromArray")(environment.handle, model, len(model), options,
                                                ctypes.byref(handle)))
        finally:
            _f("ReleaseSessionOptions")(options)
        self.handle = handle
        self.env = environment

    def binding(self) -> Binding:
        return Binding(self)

    def __del__(self):
        if not isinstance(_STATE, dict) or "functions" not in _STATE:
            return  # interpreter shutdown (module globals gone): the process frees it all
        if getattr(self, "handle", None):
            _f("ReleaseSession")(self.handle)
            self.handle = None
        if hasattr(self, "_keep"):
            self._keep.release()


class Binding:
    """An io binding of `session`: arrays bound by name (inputs and outputs), run in place.
    A bound array must stay C-contiguous and alive until rebound; the binding holds it."""

    def __init__(self, session: Session):
        self.session = session
        handle = VP()
        _check(_f("CreateIoBinding")(session.handle, ctypes.byref(handle)))
        self.handle = handle
        self._bound: dict[str, tuple[VP, np.ndarray]] = {}
        self._run = _f("RunWithBinding")
        self._session_handle = session.handle

    def bind(self, name: str, array: np.ndarray, output: bool) -> None:
        if not array.flags.c_contiguous:
            raise CApiError(f"{name}: a strided array cannot be bound")
        value = _value(array)
        try:
            _check(_f("BindOutput" if output else "BindInput")(self.handle, name.encode(),
                                                                value))
        except CApiError:
            _f("ReleaseValue")(value)
            raise
        old = self._bound.get(name)
        self._bound[name] = (value, array)
        if old is not None:
            _f("ReleaseValue")(old[0])

    def run(self) -> None:
        status = self._run(self._session_handle, None, self.handle)
        if status:
            _check(status)

    def __del__(self):
        if not isinstance(_STATE, dict) or "functions" not in _STATE:
            return
        if getattr(self, "handle", None):
            _f("ReleaseIoBinding")(self.handle)
            self.handle = None
        for value, _ in getattr(self, "_bound", {}).values():
            _f("ReleaseValue")(value)
        self._bound = {}
