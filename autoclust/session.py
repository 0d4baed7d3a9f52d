"""autoclust.InferenceSession: a drop-in for onnxruntime.InferenceSession.

    sess = autoclust.InferenceSession("model.onnx")           # auto_jit=2 by default
    sess = autoclust.InferenceSession(model, auto_jit=0)      # plain onnxruntime, validated
    outs = sess.run(None, {"x": x})

At creation it imports the model, clusters it and builds a Plan; clusters compile at
their first run. With nothing to cluster (or --auto_jit=0) it is a thin pass-through to
one onnxruntime session. Feeds are validated before anything runs: unknown or missing
names, dtypes, ranks and fixed dims raise InvalidInputError naming the input. A feed of
plain ndarrays whose names, dtypes and shapes passed those checks before skips them
(_FastFeeds: ~1 us of a few-microsecond run); anything else is checked again.

It is a drop-in down to the details: errors are also the onnxruntime exception type raised
for the same mistake (InvalidInputError is also an InvalidArgument), RunOptions reach the
onnxruntime segments and `terminate` is checked between steps, SessionOptions'
intra_op_num_threads bounds compiled kernels' threads (unless --threads is set),
io_binding(), run_with_iobinding(), run_with_ort_values() and run_async() go through the
plan, and the class is a subclass of onnxruntime.InferenceSession. Tensors NumPy has no
type for (bfloat16, float8, int4, int2) are ml_dtypes arrays, as in onnx.numpy_helper.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from typing import Any

import numpy as np
import onnx

from autoclust import flags as flags_mod
from autoclust import registry
from autoclust.errors import AutoclustError, InvalidInputError, ModelLoadError

# The onnxruntime backend (backends/ort): sessions, onnxruntime's error types, OrtValues.
ort_backend = registry.fallback()
values, iobinding = ort_backend.values, ort_backend.iobinding

_ORT_TYPE = {
    np.dtype(np.float32): "tensor(float)", np.dtype(np.float64): "tensor(double)",
    np.dtype(np.float16): "tensor(float16)", np.dtype(np.int8): "tensor(int8)",
    np.dtype(np.int16): "tensor(int16)", np.dtype(np.int32): "tensor(int32)",
    np.dtype(np.int64): "tensor(int64)", np.dtype(np.uint8): "tensor(uint8)",
    np.dtype(np.uint16): "tensor(uint16)", np.dtype(np.uint32): "tensor(uint32)",
    np.dtype(np.uint64): "tensor(uint64)", np.dtype(np.bool_): "tensor(bool)",
}


class NodeArg:
    """Name, shape and type of a model input or output, like onnxruntime's NodeArg."""

    def __init__(self, name: str, shape: list | None, type: str):
        self.name = name
        self.shape = shape
        self.type = type

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape})"


# at most this many signatures called directly (each holds an executable)
MAX_DIRECT = 64


class _InputSpec:
    """What a feed must look like: dtype, rank and the fixed dims (None = free)."""

    __slots__ = ("dims", "dtype", "name", "optional", "type_str")

    def __init__(self, vi: onnx.ValueInfoProto, optional: bool):
        self.name = vi.name
        self.optional = optional
        self.dtype = None
        self.dims = None
        self.type_str = "?"
        t = vi.type
        if t.HasField("tensor_type"):
            elem = t.tensor_type.elem_type
            try:
                self.dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))
            except (KeyError, TypeError, ValueError):
                self.dtype = None
            self.type_str = "tensor(" + onnx.TensorProto.DataType.Name(elem).lower() + ")"
            self.type_str = _ORT_TYPE.get(self.dtype, self.type_str)
            if t.tensor_type.HasField("shape"):
                self.dims = tuple(d.dim_value if d.HasField("dim_value") else
                                  (d.dim_param or None) for d in t.tensor_type.shape.dim)

    def node_arg(self) -> NodeArg:
        return NodeArg(self.name, None if self.dims is None else list(self.dims), self.type_str)

    def check(self, value: Any) -> np.ndarray:
        if not isinstance(value, np.ndarray) and not hasattr(value, "__cuda_array_interface__"):
            if self.dtype is None:
                return value  # sequences, maps, optionals: onnxruntime checks them
            value = self._convert(value)
        if self.dtype is not None and value.dtype != self.dtype:
            raise ort_backend.input_error(f"input {self.name!r}: expected dtype {self.dtype} "
                                          f"({self.type_str}), got {value.dtype}")
        if self.dims is not None:
            if value.ndim != len(self.dims):
                raise ort_backend.input_error(
                    f"input {self.name!r}: expected rank {len(self.dims)} with shape "
                    f"{_fmt_dims(self.dims)}, got rank {value.ndim} with shape {value.shape}")
            for axis, (want, got) in enumerate(zip(self.dims, value.shape)):
                if isinstance(want, int) and want > 0 and want != got:
                    raise ort_backend.input_error(
                        f"input {self.name!r}: dim {axis} must be {want} (expected shape "
                        f"{_fmt_dims(self.dims)}), got shape {value.shape}")
        return value

    def _convert(self, value: Any) -> np.ndarray:
        # onnxruntime makes Python lists into the input's own type ([[1, 2]] feeds a float
        # input); NumPy scalars keep their dtype and are checked like arrays.
        if isinstance(value, list | tuple):
            try:
                return np.asarray(value, dtype=self.dtype)
            except (TypeError, ValueError) as exc:
                raise ort_backend.input_error(f"input {self.name!r}: cannot make a "
                                              f"{self.type_str} from the list: {exc}") from None
        return np.asarray(value)


class _FastFeeds:
    """Feed signatures already validated, so run() can skip _validate for them.

    A feed is known when it is a dict naming exactly the required inputs, each value a
    plain ndarray (any strides: the executable copies non-contiguous ones) of the input's
    dtype and of a shape that passed _InputSpec.check before (shapes are remembered per
    input, at most MAX_SHAPES each).
    Anything else (lists, scalars, subclasses, device arrays, optional inputs, a new
    shape or dtype) takes the full validation, which raises the errors.
    """

    MAX_SHAPES = 64

    def __init__(self, specs: list[_InputSpec]):
        required = [s for s in specs if not s.optional]
        self.count = len(required)
        # name -> (dtype, shapes seen valid); inputs of unknown type never take the fast path
        self.seen: dict[str, tuple[np.dtype, set]] = {
            s.name: (s.dtype, set()) for s in required if s.dtype is not None}
        self.enabled = len(self.seen) == self.count

    def key(self, feed: Any) -> tuple | None:
        """The shapes of `feed` in the inputs' order when it matches signatures validated
        before (run()'s key for its direct calls), else None (cheap: one tuple)."""
        if type(feed) is not dict or len(feed) != self.count or not self.enabled:
            return None
        shapes = []
        for name, (dtype, valid) in self.seen.items():
            x = feed.get(name)
            if type(x) is not np.ndarray or x.dtype != dtype or x.shape not in valid:
                return None
            shapes.append(x.shape)
        return tuple(shapes)

    def known(self, feed: Any) -> bool:
        """Whether `feed` matches signatures validated before."""
        return self.key(feed) is not None

    def learn(self, feed: dict[str, Any]) -> None:
        """Remember the shapes of a feed that has just passed _validate."""
        if len(feed) != self.count:
            return
        for name, x in feed.items():
            entry = self.seen.get(name)
            if (entry is not None and type(x) is np.ndarray and x.dtype == entry[0]
                    and len(entry[1]) < self.MAX_SHAPES):
                entry[1].add(x.shape)


def _fmt_dims(dims: tuple) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _uses_custom_ops(model: onnx.ModelProto) -> bool:
    """Whether the model uses an op registered with autoclust.register_op."""
    from autoclust.ops import custom
    return custom.in_model(model)


def _specs(model: onnx.ModelProto) -> tuple[list[_InputSpec], list[NodeArg]]:
    inits = {i.name for i in model.graph.initializer}
    inputs = [_InputSpec(vi, vi.name in inits) for vi in model.graph.input]
    outputs = [_InputSpec(vi, False).node_arg() for vi in model.graph.output]
    return inputs, outputs


class InferenceSession(ort_backend.ORIGINAL_SESSION):
    """Drop-in replacement for onnxruntime.InferenceSession with auto-clustering.

    A subclass of onnxruntime's class for isinstance checks; onnxruntime methods not
    defined here (end_profiling, set_providers, ...) act on a whole-model onnxruntime
    session created when first needed.
    """

    def __init__(self, path_or_bytes: Any, sess_options: Any = None, providers: Any = None,
                 provider_options: Any = None, **flag_overrides: Any):
        load_model = registry.importer("onnx").load_model
        self._flags = _session_flags(sess_options, flag_overrides)
        self._sess_options = sess_options
        self._providers = providers
        self._provider_options = provider_options
        self._source = path_or_bytes
        try:
            # The weights are read once, into arrays the importer and onnxruntime share;
            # onnxruntime alone (--auto_jit=0) reads them itself.
            self._loaded = load_model(path_or_bytes, weights=self._flags.auto_jit > 0)
            if self._flags.auto_jit == 0 and _uses_custom_ops(self._loaded.proto):
                self._loaded = load_model(path_or_bytes)  # our runtime runs it after all
        except ModelLoadError as exc:
            raise ort_backend.load_error_like_onnxruntime(path_or_bytes, str(exc)) from None
        self._model = self._loaded.proto  # the large initializers are stubs here
        self._input_specs, self._outputs = _specs(self._model)
        self._required = [s for s in self._input_specs if not s.optional]
        self._spec_by_name = {s.name: s for s in self._input_specs}
        self._output_names = [o.name for o in self._outputs]
        self._output_set = frozenset(self._output_names)
        self._ort = None
        self._ort_rebuilt = False  # once, without buffer reuse (_drop_buffer_reuse)
        self._ort_disabled: list[str] = []  # see _drop_failed_optimizers
        self._ort_lock = threading.Lock()
        self._ort_values = False  # the pass-through session needs OrtValues (bfloat16, ...)
        self._runtime = None
        self.plan = None
        self._dumper = None
        self._mover: Any = None  # a device backend (Policy.device_memory) moving values
        if self._flags.auto_jit > 0 or _uses_custom_ops(self._model):
            self._build_plan()  # a custom op needs our runtime even at --auto_jit=0
        if self._runtime is None:
            self._ort = self._full_session()
            self._ort_values = values.needs_ort_values(self._ort)
        # run()'s fast path: host plans, or the pass-through session fed NumPy arrays
        host_plan = self._runtime is not None and self._runtime.device is None
        self._ort_run = None if self._ort is None or self._ort_values else \
            ort_backend.direct_run(self._ort)
        self._fast = _FastFeeds(self._input_specs) \
            if (host_plan or self._ort_run is not None) and self._mover is None else None
        # feed shapes (_FastFeeds.key) -> what serves that signature, called by run() with
        # (output names, feed, None) in place of the plan: onnxruntime's run over the whole
        # model for signatures measured placement handed back whole (as --auto_jit=0
        # would), or a one-step plan's settled executable (Runtime.direct)
        self._direct: dict[tuple, Any] = {}
        self._one_step = host_plan and self._runtime._single is not None
        whole = getattr(self._runtime, "whole", None)
        if whole is not None and self._fast is not None:
            whole.on_handed_back = self._hand_back
        if self._flags.log:
            print(self._active_line(), file=sys.stderr)

    # ---- construction -----------------------------------------------------------------
    def _full_session(self, options: Any = None) -> Any:
        """onnxruntime over the whole model, made once with the user's options as they are
        (onnxruntime reads them); `options` given: made again with those."""
        with self._ort_lock:
            if self._ort is None or options is not None:
                source = self._source
                if isinstance(source, os.PathLike):
                    source = os.fspath(source)
                elif isinstance(source, bytearray | memoryview):
                    source = bytes(source)
                self._ort = ort_backend.create_session(
                    source, options or self._sess_options, self._providers,
                    self._provider_options, parsed=self._model, disable=self._ort_disabled)
        return self._ort

    @property
    def _sess(self) -> Any:
        # onnxruntime's own methods we inherit reach its C session through this attribute.
        return self._full_session()._sess

    def _build_plan(self) -> None:
        from autoclust.clustering.partition import check_must_compile, cluster
        from autoclust.runtime import runner as runtime
        import_model = registry.importer("onnx").import_model
        backend = registry.get_backend(self._flags.device)
        if registry.policy(backend).device_memory:
            require = getattr(backend, "require_device", None)
            if require is not None:
                require()  # DeviceUnavailableError naming what is missing
            self._mover = backend
        try:
            graph = import_model(self._loaded)
        except ModelLoadError as exc:
            if _uses_custom_ops(self._model):
                raise  # onnxruntime cannot load a custom op: our error is the whole story
            # Stricter than onnxruntime? Run the model as onnxruntime would, or raise both.
            try:
                self._full_session()
            except ModelLoadError as ort_exc:
                raise ort_backend.load_error(f"{exc}; {ort_exc}", ort_exc) from None
            warnings.warn(f"autoclust: cannot import the model ({exc}); running it with "
                          "onnxruntime only", RuntimeWarning, stacklevel=3)
            return
        self.plan = cluster(graph, self._flags, backend.why_not)
        if self._flags.must_compile:
            check_must_compile(self.plan)
        if self._flags.dump_to:
            from autoclust.report.dump import Dumper
            self._dumper = Dumper.create(self._flags.dump_to, self._flags)
            if self._dumper is not None:
                self._dumper.write_plan(self.plan)
        if (not self.plan.clusters and not self.plan.control_flow
                and not _uses_custom_ops(self._model)):
            return
        try:
            self._runtime = runtime.Runtime(self.plan, self._flags, backend,
                                            self._sess_options, self._providers,
                                            self._provider_options, self._dumper)
            if not _uses_custom_ops(self._model):  # else onnxruntime cannot load it whole
                self._runtime.whole_source = (self._model, self._loaded.weights)
        except AutoclustError:
            raise
        except Exception as exc:  # e.g. onnxruntime refusing a sub-model: run it whole
            if self._flags.must_compile:
                raise
            warnings.warn(f"autoclust: could not partition the model ({type(exc).__name__}: "
                          f"{exc}); running it with onnxruntime only", RuntimeWarning,
                          stacklevel=3)
            self._runtime = None

    def _active_line(self) -> str:
        """The --log line saying autoclust is active, with the cluster summary."""
        where = self._source if isinstance(self._source, str) else \
            repr(self._model.graph.name or "model")
        mode = f"auto_jit={self._flags.auto_jit}, device={self._flags.device}"
        if self.plan is None:
            what = "auto_jit is 0" if self._flags.auto_jit == 0 else "model not imported"
            return f"autoclust: active on {where} ({mode}): {what}; onnxruntime runs it all"
        from autoclust.report import explain
        summary = explain.explain_text(self.plan).splitlines()[0]
        tail = "" if self._runtime is not None else "; onnxruntime runs it all"
        return f"autoclust: active on {where} ({mode}): {summary}{tail}"

    # ---- running ----------------------------------------------------------------------
    def _validate(self, input_feed: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(input_feed, dict):
            raise ort_backend.input_error(f"input_feed must be a dict of name -> array, got "
                                          f"{type(input_feed).__name__}")
        feeds = {}
        for name, value in input_feed.items():
            spec = self._spec_by_name.get(name)
            if spec is None:
                known = ", ".join(s.name for s in self._input_specs)
                raise ort_backend.input_error(f"unknown input {name!r}; the model's inputs "
                                              f"are: {known}")
            feeds[name] = spec.check(self._device_value(name, value))
        if len(feeds) < len(self._required):
            missing = [s.name for s in self._required if s.name not in feeds]
            if missing:  # onnxruntime raises a plain ValueError here; ours is one too
                raise InvalidInputError(
                    f"missing input(s): {', '.join(missing)}")
        return feeds

    def run(self, output_names: list[str] | None, input_feed: dict[str, Any],
            run_options: Any = None, output_device: str = "cpu") -> list[Any]:
        """Run the model; outputs in the order of output_names (all outputs for None).

        output_device="gpu" (a device with its own memory) returns device arrays (CuPy);
        feeds may be device arrays (CuPy, torch CUDA tensors) on a device session.
        """
        fast = self._fast
        try:
            key = fast.key(input_feed) if (fast is not None and run_options is None
                                           and output_device == "cpu") else None
            if key is not None:  # a signature validated before
                if output_names:
                    self._check_output_names(output_names)
                else:
                    output_names = self._output_names
                if self._runtime is None:
                    return self._ort_run(output_names, input_feed, None)
                direct = self._direct.get(key)
                if direct is not None:
                    return direct(output_names, input_feed, None)
                outs = self._runtime.run_outputs(input_feed, output_names)
                if self._one_step and len(self._direct) < MAX_DIRECT:
                    self._settle(key, input_feed)
                return outs
            return self._run(output_names, input_feed, run_options, output_device)
        except ort_backend.Fail as exc:
            if not self._drop_failed_optimizers(exc) and (
                    ort_backend.PLANNER_FAILURE not in str(exc) or
                    not self._drop_buffer_reuse(exc)):
                raise
            return self.run(output_names, input_feed, run_options, output_device)
        except InvalidInputError as exc:  # from compiled checks too (an index out of range,
            # an integer division by zero): also onnxruntime's InvalidArgument (its Fail for
            # an InvalidShapeError), as everywhere
            mapped = ort_backend.as_onnxruntime_error(exc)
            if mapped is exc:
                raise
            raise mapped from exc

    def _run(self, output_names: list[str] | None, input_feed: dict[str, Any],
             run_options: Any, output_device: str) -> list[Any]:
        fast = self._fast
        to_device = self._output_mover(output_device)
        feeds = self._validate(input_feed)
        if fast is not None:
            fast.learn(input_feed)
        if output_names:
            self._check_output_names(output_names)
        if self._runtime is None:
            if self._mover is not None:
                feeds = {k: self._mover.to_host(v) for k, v in feeds.items()}
            if self._ort_values:
                outs = values.run(self._ort, output_names, feeds, run_options)
            else:
                outs = self._ort.run(output_names, feeds, run_options)
            return outs if to_device is None else [to_device(o) for o in outs]
        names = list(output_names or self._output_names)
        if self._runtime.device is not None:
            if run_options is not None and run_options.terminate:
                return self._runtime.run(feeds, run_options)  # raises onnxruntime's Fail
            return self._runtime.device.run(feeds, names, to_device is not None)
        env = self._runtime.run(feeds, run_options)
        outs = [env[n] for n in names]
        return outs if to_device is None else [to_device(o) for o in outs]

    def _drop_failed_optimizers(self, exc: BaseException) -> bool:
        """A run of the whole-model session without a plan failed in a node an onnxruntime
        optimizer inserted (ort_backend.INSERTED_BY; MatMulAddFusion's Reshape of a zero-size
        A, where plain onnxruntime fails too): the session is made again without it, warning
        once. Segments do the same themselves (Segment.run_feeds)."""
        guilty = ort_backend.failed_optimizers(exc, self._ort_disabled)
        if self._runtime is not None or not guilty:
            return False
        self._ort_disabled += guilty
        ort_backend.warn_optimizer_failure(exc, "the whole model", guilty, stacklevel=4)
        self._rebuild_full_session()
        return True

    def _rebuild_full_session(self) -> None:
        """Make the pass-through session again with what the drops above decided (buffer
        reuse off once _ort_rebuilt; _ort_disabled's optimizers off), and its run entry."""
        with self._ort_lock:
            self._ort = None
        self._full_session(ort_backend.without_buffer_reuse(self._sess_options, sub_session=False)
                           if self._ort_rebuilt else None)
        if self._ort_run is not None:
            self._ort_run = ort_backend.direct_run(self._ort)

    def _drop_buffer_reuse(self, exc: BaseException) -> bool:
        """onnxruntime's memory planner failed in a session run() calls itself (PLANNER_FAILURE):
        the whole-model session without a plan is rebuilt once with buffer reuse off (a plain
        onnxruntime session raises here: fuzz 154/217, a zero-size MatMul beside a [2, 5, 1]
        one); signatures handed back to onnxruntime go through their segments again, which
        rebuild themselves (Segment.run_feeds). False where nothing is left to rebuild."""
        if self._runtime is None and not self._ort_rebuilt:
            self._ort_rebuilt = True
            ort_backend.warn_planner_failure(exc, "the whole model", stacklevel=4)
            self._rebuild_full_session()
            return True
        if self._direct:
            self._direct.clear()
            return True
        return False

    def _settle(self, key: tuple, feed: dict[str, np.ndarray]) -> None:
        """After a fast-path run of a one-step plan: once its executable serves this
        signature for good, run() calls it directly (skipping the plan's two layers)."""
        direct = self._runtime.direct(feed)
        if direct is not None:
            self._direct[key] = direct

    def _hand_back(self, key: tuple, segment: Any) -> None:
        """Measured placement handed the plan back for signature `key` (the feeds' names,
        then (dtype, shape) per feed): run() calls `segment`'s onnxruntime directly."""
        if not segment.ort_values:  # bfloat16 & co. go through OrtValues: the long way
            shape_of = {name: shape for name, (_, shape) in zip(key[0], key[1:])}
            assert self._fast is not None  # handed back only where run() has a fast path
            shapes = tuple(shape_of[name] for name in self._fast.seen)
            self._direct[shapes] = ort_backend.direct_run(segment.session)

    def _check_output_names(self, output_names: list[str]) -> None:
        for n in output_names:
            if n not in self._output_set:
                raise ort_backend.input_error(f"unknown output {n!r}; the model's outputs"
                                              f" are: {', '.join(self._output_names)}")

    def run_with_ort_values(self, output_names: list[str] | None,
                            input_dict_ort_values: dict[str, Any],
                            run_options: Any = None) -> list[Any]:
        """run() with onnxruntime OrtValues in and out (through the compiled plan)."""
        feeds = input_dict_ort_values
        if isinstance(feeds, dict):  # else run() raises the error
            feeds = {k: values.from_ort_value(v) for k, v in feeds.items()}
        return [values.to_ort_value(x) for x in self.run(output_names, feeds, run_options)]

    def io_binding(self) -> iobinding.IOBinding:
        """An IOBinding whose runs (run_with_iobinding) go through the compiled plan."""
        return iobinding.IOBinding(self)

    def run_with_iobinding(self, iobinding_: Any, run_options: Any = None) -> None:
        """Run with the inputs and outputs bound in `iobinding_` (from io_binding())."""
        iobinding.run(self, iobinding_, run_options)

    def run_async(self, output_names: list[str] | None, input_feed: dict[str, Any],
                  callback: Any, user_data: Any, run_options: Any = None) -> None:
        """run() on another thread; then callback(outputs, user_data, error string)."""
        self._validate(input_feed)  # bad feeds raise here, as onnxruntime's run_async does

        def work() -> None:
            try:
                outs = self.run(output_names, input_feed, run_options)
            except Exception as exc:  # noqa: BLE001 - reported through the callback
                callback(None, user_data, f"{type(exc).__name__}: {exc}")
                return
            callback(outs, user_data, "")
        threading.Thread(target=work, name="autoclust-run-async", daemon=True).start()

    def _output_mover(self, output_device: str) -> Any:
        """None for host outputs, else the to_device of the backend called output_device."""
        if output_device == "cpu":
            return None
        from autoclust import registry
        backend = self._mover
        if backend is None or getattr(backend, "NAME", None) != output_device:
            backend = registry.get_backend(output_device)
        if not registry.policy(backend).device_memory:
            raise InvalidInputError(f"output_device={output_device!r} has no memory of its "
                                    "own; use 'cpu' or a device such as 'gpu'")
        require = getattr(backend, "require_device", None)
        if require is not None:
            require()
        return backend.to_device

    def _device_value(self, name: str, value: Any) -> Any:
        """A device-array feed as the session's device array type (torch CUDA tensors
        through DLPack, no copy); InvalidInputError on a host-only session."""
        if type(value) is np.ndarray or not hasattr(value, "__cuda_array_interface__"):
            return value
        if self._mover is None:
            raise InvalidInputError(
                f"input {name!r} is a device array ({type(value).__name__}) but this session "
                f"runs on the host (--device={self._flags.device}): pass a NumPy array, or "
                "create the session with device='gpu'")
        return self._mover.to_device(value)

    # ---- onnxruntime's informational API ----------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return [s.node_arg() for s in self._input_specs if not s.optional]

    def get_overridable_initializers(self) -> list[NodeArg]:
        return [s.node_arg() for s in self._input_specs if s.optional]

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def set_providers(self, providers: Any = None, provider_options: Any = None) -> None:
        """onnxruntime's set_providers on the whole-model session (which it rebuilds)."""
        ort_sess = self._full_session()
        ort_sess.set_providers(providers, provider_options)
        if self._ort_run is not None:  # the cached entry point belongs to the old session
            self._ort_run = ort_backend.direct_run(ort_sess)

    def get_modelmeta(self) -> Any:
        return self._full_session().get_modelmeta()

    def get_providers(self) -> list[str]:
        return self._full_session().get_providers() if self._ort is not None \
            else list(self._providers or ["CPUExecutionProvider"])

    def get_provider_options(self) -> dict:
        return self._full_session().get_provider_options()

    def get_session_options(self) -> Any:
        return self._full_session().get_session_options()

    def explain(self, as_json: bool = False) -> Any:
        """What was clustered and why the rest was not (text, or the JSON dict)."""
        from autoclust.report import explain
        if self.plan is None:
            reason = "auto_jit is 0" if self._flags.auto_jit == 0 else "model not imported"
            return {"nodes": len(self._model.graph.node), "clusters": [], "unclustered": [],
                    "note": reason} if as_json else f"No clustering: {reason}."
        if as_json:
            out = explain.explain_json(self.plan)
            copied = self._last_copies()
            if copied is not None:
                out["copied_last_run"] = {"h2d": copied.h2d, "d2h": copied.d2h}
            return out
        text = explain.explain_text(self.plan)
        copied = self._last_copies()
        if copied is not None:
            text += (f"\nMeasured in the last run: {copied.h2d} bytes host -> device, "
                     f"{copied.d2h} bytes device -> host ({copied.copies} copies)")
        return text

    def _last_copies(self) -> Any:
        device = getattr(self._runtime, "device", None)
        return None if device is None else device.last_copies

    def stats(self) -> dict[str, Any]:
        """Per-cluster compile/run counts and fallbacks (for tests and `autoclust run`)."""
        if self._runtime is None:
            return {"clusters": []}
        out = []
        for r in self._runtime.compiled_clusters():
            kernels = [getattr(e, "num_kernels", 0) for e in r.cache.values()]
            out.append({"name": r.name, "compiles": r.compiles, "runs": r.runs,
                        "kernels": kernels, "fallback": r.fallback_reason or None})
        return {"clusters": out}

    @property
    def flags(self) -> flags_mod.Flags:
        return self._flags

    def __getattr__(self, name: str) -> Any:
        # Anything else onnxruntime's session offers runs on a whole-model onnxruntime
        # session.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._full_session(), name)


def _session_flags(sess_options: Any, overrides: dict[str, Any]) -> flags_mod.Flags:
    """The flags: AUTOCLUST_FLAGS and keyword overrides; SessionOptions'
    intra_op_num_threads bounds compiled kernels' threads when --threads is not set."""
    flags = flags_mod.parse(**overrides)
    threads = getattr(sess_options, "intra_op_num_threads", 0) if sess_options else 0
    if threads > 0 and flags.threads == 0:
        flags = flags.replace(threads=threads)
    return flags
