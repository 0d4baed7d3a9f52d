"""The onnxruntime fallback: sessions over whole models and over exported sub-models.

Every sub-session copies the user's SessionOptions (so onnxruntime's own graph
optimizations and thread settings apply) and turns intra-op thread spinning off: a plan
runs several sessions one after another, and spinning pools left behind by one session
would steal the cores from the next (measured in benchmarks/bench_plan_overhead).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from autoclust.backends.ort import iobinding, values  # noqa: F401 - the session's
from onnxruntime.capi import onnxruntime_pybind11_state as _C

from autoclust import errors
from autoclust.errors import ModelLoadError

# The hook replaces onnxruntime.InferenceSession in user programs; our own sessions must
# always be onnxruntime's class.
ORIGINAL_SESSION = getattr(ort.InferenceSession, "_autoclust_original", ort.InferenceSession)

_COPIED_OPTIONS = (
    "graph_optimization_level", "intra_op_num_threads", "inter_op_num_threads",
    "execution_mode", "enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse",
    "log_severity_level", "log_verbosity_level", "use_deterministic_compute",
)


SPINNING = ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning")


def sub_session_options(user: ort.SessionOptions | None, threads: int = 0,
                        spinning: bool = False) -> ort.SessionOptions:
    """SessionOptions for a sub-session: the user's settings, spinning off by default."""
    so = ort.SessionOptions()
    if user is not None:
        for name in _COPIED_OPTIONS:
            try:
                setattr(so, name, getattr(user, name))
            except (AttributeError, TypeError):
                pass
    if threads > 0 and (user is None or user.intra_op_num_threads == 0):
        so.intra_op_num_threads = threads
    for key in SPINNING:
        if not spinning:
            so.add_session_config_entry(key, "0")
        elif user is not None:  # the user's own setting, where they made one
            try:
                so.add_session_config_entry(key, user.get_session_config_entry(key))
            except RuntimeError:  # not set: onnxruntime's default
                pass
    return so


def without_buffer_reuse(user: ort.SessionOptions | None, sub_session: bool = True
                         ) -> ort.SessionOptions:
    """A copy of `user` with the memory planner's buffer reuse off (PLANNER_FAILURE): a
    sub-session's (spinning off), or for the user's own whole-model session their
    spinning setting kept."""
    so = sub_session_options(user, spinning=not sub_session)
    so.enable_mem_reuse = False
    return so


def create_session(model: onnx.ModelProto | bytes | str, options: ort.SessionOptions | None,
                   providers: Any = None, provider_options: Any = None,
                   external: dict[str, np.ndarray] | None = None,
                   parsed: onnx.ModelProto | None = None, disable: Sequence[str] = ()) -> Any:
    """An onnxruntime InferenceSession; load failures become ModelLoadError.

    `external`: arrays for the initializers the model holds as stubs (export_model's and
    the importer's), handed over as OrtValues without a copy (the session keeps them);
    they are added to `options`, which must be the caller's own. `parsed`: the model as a
    ModelProto when `model` is its file or bytes (see broken_optimizers). `disable`: more
    graph optimizers to turn off (one whose node failed a run: Segment.run_feeds)."""
    proto = model if isinstance(model, onnx.ModelProto) else parsed
    found = broken_optimizers(proto) if proto is not None else []
    disabled = list(dict.fromkeys(found + list(disable)))
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    if providers is None:
        providers = ["CPUExecutionProvider"]
    kept = None
    if external:
        if options is None:
            options = ort.SessionOptions()
        kept = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a))
                for a in external.values()]
        options.add_external_initializers(list(external), kept)
    while True:
        try:
            session = ORIGINAL_SESSION(model, options, providers=providers,
                                       provider_options=provider_options,
                                       **({"disabled_optimizers": disabled} if disabled else {}))
            break
        except Exception as exc:  # noqa: BLE001 - onnxruntime's own Fail/InvalidGraph/...
            guilty = failed_optimizers(exc, disabled)
            if not guilty:
                where = model if isinstance(model, str) else "model bytes"
                raise load_error(f"onnxruntime could not load {where}: {exc}", exc) from None
            disabled = disabled + guilty
    if kept is not None:
        session._autoclust_external = kept  # onnxruntime reads them in place
    return session


# Nodes an onnxruntime optimizer inserts, by the name it gives them, and the optimizer: a
# load failure naming one is that optimizer's, and the session is made again without it.
# MatMulAddFusion reshapes a 1-D A to [1, K] for its Gemm, and its Reshape to [1, 0] fails
# shape inference where onnxruntime knows K = 0 ("Node (gemm_input_reshape) Op (Reshape)
# [ShapeInferenceError] Invalid position of 0", fuzz 100/794: a Split's empty output @
# [0, 2] + b; plain onnxruntime cannot load the model either, and without the fusion it
# answers b). Its Reshape of the Gemm's result back to A's rank fails the same way when
# N = 0 ("gemm_output_reshape", fuzz 165/2033: [1, 1, 1, 1] @ [1, 0] + [0]). Known only
# once onnxruntime has inferred the shapes, hence no check ahead.
INSERTED_BY = {"gemm_input_reshape": "MatMulAddFusion", "gemm_output_reshape": "MatMulAddFusion"}


def broken_optimizers(model: onnx.ModelProto) -> list[str]:
    """onnxruntime graph optimizers to turn off for `model`: those that crash onnxruntime on
    it or make it answer wrongly or fail. All were found by `autoclust fuzz` through
    sessions autoclust made (a cluster's side in measured placement, a fallback segment,
    the whole model); plain onnxruntime 1.31 fails the same way on the same model:
      - MatmulTransposeFusion at ORT_ENABLE_ALL segfaults creating the session on a float16
        graph in which a Transpose that is not a swap of the last two dims (perm [1, 2, 0]
        of a 3-D tensor) feeds a MatMul with a constant B (seed 77; float32 is fine),
        directly or through ops it removes first (PASS_THROUGH; seed 98/1553), or through
        a Concat (152/464): in a float16 graph, through any ops.
        Turning off any one of MatmulTransposeFusion,
        FuseFp16InitializerToFp32NodeTransformer, NchwcTransformer avoids it;
      - the same fusion answers wrongly (float32 too) where a Transpose feeds a MatMul's A
        and B is 1-D: Transpose([3, 2]) @ [3] gave [0.014, 1.365] for [-0.690, 0.985]
        (seed 80). It has no float16 CPU kernel to fuse into, and the A side with a vector
        B is not where attention's transposes are (K^T is B's), so turning it off costs
        nothing that matters; a B of unknown rank counts as 1-D; nor where a fused MatMul
        or its Transpose has an operand the graph states a zero-size dim for (an empty
        batch fails, K = 0 leaves garbage: 105/1067, 105/1295; _empty_operand);
      - the transpose optimizer (ORT_ENABLE_BASIC and up), moving a Transpose through a Pad
        with an axes input (opset 18+), reads 2 x rank pads where there are 2 x len(axes)
        and fails at run time ("Gather ... indices element out of data bounds", every mode;
        seed 89/76): both of its passes go off where a graph has such a Pad and a
        Transpose."""
    graph = model.graph
    off = []
    if any(n.op_type == "Pad" and len(n.input) > 3 and n.input[3] for n in graph.node) and \
            any(n.op_type == "Transpose" for n in graph.node):
        off = ["TransposeOptimizer", "TransposeOptimizer_CPUExecutionProvider"]
    return off + _matmul_transpose_fusion(model)


# Ops onnxruntime removes or fuses through before MatmulTransposeFusion sees the graph
# (an Expand or Reshape to the same shape, Identity, Dropout, a Cast pair): a Transpose
# behind them feeds the MatMul as if directly (fuzz 98/1553: Transpose -> Expand to the
# same [1, 1, 3] -> MatMul, float16, segfaulted).
PASS_THROUGH = frozenset({"Expand", "Reshape", "Identity", "Dropout", "Cast"})
# FLOAT16_ANYWHERE: in a float16 graph the segfault also came from a Transpose reaching
# the MatMul through a Concat (fuzz 152/464: Transpose [1, 2, 0] -> Concat with a constant
# -> MatMul by a 1-D B; a cluster's fallback segment died where the whole model had not),
# so there a Transpose anywhere upstream of a MatMul or Gemm turns the fusion off; it has
# no float16 CPU kernel to fuse into, and turning it off costs nothing.


def _matmul_transpose_fusion(model: onnx.ModelProto) -> list[str]:
    """["MatmulTransposeFusion"] where it breaks `model` (broken_optimizers), else []."""
    graph = model.graph
    transposed = {o for n in graph.node if n.op_type == "Transpose" for o in n.output}
    float16 = _has_float16(graph)
    for n in graph.node:  # in graph (topological) order
        if float16 and transposed.intersection(n.input) and n.op_type not in ("MatMul", "Gemm"):
            transposed.update(n.output)  # FLOAT16_ANYWHERE
        elif n.op_type in PASS_THROUGH and n.input and n.input[0] in transposed:
            transposed.update(n.output[:1])
    fed = [n for n in graph.node if n.op_type in ("MatMul", "Gemm")
           and transposed.intersection(n.input)]
    if not fed:
        return []
    if float16 or _empty_operand(graph, fed, transposed):
        return ["MatmulTransposeFusion"]
    a_side = [n for n in fed if n.op_type == "MatMul" and n.input[0] in transposed
              and len(n.input) > 1]
    ranks = _ranks(graph)
    if any(n.input[1] not in ranks for n in a_side):
        # B is an intermediate the model states no shape for: ONNX's inference may
        with contextlib.suppress(Exception):  # none: such a B counts as 1-D
            ranks.update(_ranks(onnx.shape_inference.infer_shapes(model).graph))
    if any(ranks.get(n.input[1], 1) == 1 for n in a_side):
        return ["MatmulTransposeFusion"]
    return []


def crashing_division(graph: Any, nodes: Iterable[Any] | None = None) -> str | None:
    """Why onnxruntime may kill the process running `graph` (autoclust's Graph) on some
    input, or None. onnxruntime 1.31's int32/int64 Div, and Mod without fmod, divide
    INT_MIN by -1 with the CPU's own instruction, which raises SIGFPE (fuzz seed 81/371; a
    zero divisor it checks and reports). The compiled code answers INT_MIN, as NumPy does,
    so autoclust must not hand such a division to onnxruntime just to time it, nor leave
    it to a fallback segment (clustering keeps its cluster at any size: fuzz 93/2258).
    Safe: a constant divisor without -1, or a constant dividend without INT_MIN. `nodes`:
    only these of the graph's (a cluster's members)."""
    for node in graph.nodes if nodes is None else nodes:
        if node.op not in ("Div", "Mod") or (node.op == "Mod" and node.attrs.get("fmod", 0)):
            continue
        dtype = node.outputs[0].dtype
        if dtype is None or dtype.name not in ("int32", "int64"):
            continue
        a, b = (graph.constant_value(v) for v in node.inputs[:2])
        if (b is not None and not (b == -1).any()) or \
                (a is not None and not (a == np.iinfo(dtype).min).any()):
            continue
        return (f"{node.name} ({node.op} of {dtype.name}): onnxruntime's kernel kills the "
                "process (SIGFPE) dividing INT_MIN by -1, which the compiled code answers")
    return None


def crashing_node(graph: Any, nodes: Iterable[Any] | None = None) -> str | None:
    """Why onnxruntime may kill the process running `graph` (autoclust's Graph), or None:
    a division it traps on (crashing_division), or an InstanceNormalization of a tensor
    the graph states a zero-size dim for, after which onnxruntime 1.31 segfaults in the
    next node (float32 and float16; fuzz 148/1653: Mish -> InstanceNormalization of
    [1, 4, 5, 0] -> Min; plain onnxruntime dies the same way). Compiled code answers the
    empty tensor, so such a node stays in a cluster and is never timed against
    onnxruntime. A dim that is 0 only at run time is not seen here. `nodes`: as
    crashing_division."""
    why = crashing_division(graph, nodes)
    if why is not None:
        return why
    for node in graph.nodes if nodes is None else nodes:
        shape = node.inputs[0].shape if node.op == "InstanceNormalization" else None
        if shape is not None and any(isinstance(d, int) and d == 0 for d in shape):
            return (f"{node.name} (InstanceNormalization of shape {list(shape)}): onnxruntime "
                    "kills the process (SIGSEGV) in the node after an empty one")
    return None


def _has_float16(graph: onnx.GraphProto) -> bool:
    f16 = onnx.TensorProto.FLOAT16
    typed = [*graph.input, *graph.output, *graph.value_info]
    return (any(v.type.tensor_type.elem_type == f16 for v in typed)
            or any(t.data_type == f16 for t in graph.initializer)
            or any(n.op_type == "Cast" and any(a.name == "to" and a.i == f16
                                               for a in n.attribute) for n in graph.node))


def _empty_operand(graph: onnx.GraphProto, fed: list, transposed: set[str]) -> bool:
    """Whether a MatMul/Gemm the fusion would take, or a Transpose feeding one, has an
    operand the graph states a zero-size dim for. FusedMatMul over such operands fails
    ("left operand cannot broadcast on dim 0": [0, 2, 1] transposed @ [2, 1], fuzz
    105/1067) or, with K = 0, leaves its output unwritten: garbage where zeros are due
    ([2, 0, 2] transposed @ [2, 0, 1], 105/1295). Plain onnxruntime 1.31 does the same;
    a dim that is 0 only at run time is not seen here."""
    zero = {name for name, dims in _stated_shapes(graph).items() if 0 in dims}
    if not zero:
        return False
    names = {x for n in fed for x in n.input}
    names |= {x for n in graph.node if n.op_type in ("Transpose", *PASS_THROUGH)
              and transposed.intersection(n.output) for x in n.input[:1]}
    return bool(zero & names)


def _stated_shapes(graph: onnx.GraphProto) -> dict[str, list[int | None]]:
    """The shapes the graph states (initializers, inputs, outputs, value_info), a dim
    None where it is symbolic or unknown."""
    shapes: dict[str, list[int | None]] = {t.name: list(t.dims) for t in graph.initializer}
    for v in [*graph.input, *graph.output, *graph.value_info]:
        if v.type.tensor_type.HasField("shape"):
            shapes.setdefault(v.name, [d.dim_value if d.HasField("dim_value") else None
                                       for d in v.type.tensor_type.shape.dim])
    return shapes


def _ranks(graph: onnx.GraphProto) -> dict[str, int]:
    """The ranks the graph states (_stated_shapes)."""
    return {name: len(dims) for name, dims in _stated_shapes(graph).items()}


# ---- errors: ours, and also the type onnxruntime raises for the same mistake ------------

# onnxruntime's exception types (pybind11-registered, in onnxruntime_pybind11_state).
InvalidArgument = _C.InvalidArgument
Fail = _C.Fail
# onnxruntime's own failure that a session without buffer reuse does not make
# (Segment._without_buffer_reuse)
PLANNER_FAILURE = "attempting to re-use buffer"


def input_error(message: str) -> errors.InvalidInputError:
    """A bad feed: InvalidInputError that is also onnxruntime's InvalidArgument."""
    return errors.also(errors.InvalidInputError, InvalidArgument)(message)


def as_onnxruntime_error(exc: errors.InvalidInputError) -> errors.InvalidInputError:
    """exc, typed also as what onnxruntime raises for the same mistake: Fail for an
    InvalidShapeError, InvalidArgument for the other bad inputs."""
    kind = Fail if isinstance(exc, errors.InvalidShapeError) else InvalidArgument
    if isinstance(exc, kind):
        return exc
    return errors.also(type(exc) if type(exc).__module__ == errors.__name__ else
                       errors.InvalidInputError, kind)(str(exc))


def load_error(message: str, ort_exc: BaseException | None) -> ModelLoadError:
    """ModelLoadError that is also the type onnxruntime raised loading the same model
    (InvalidProtobuf, NoSuchFile, InvalidGraph, Fail, TypeError, ...)."""
    kind = type(ort_exc) if ort_exc is not None else None
    if kind is None or not (kind.__module__.startswith("onnxruntime")
                            or kind in (TypeError, ValueError, RuntimeError)):
        return ModelLoadError(message)
    return errors.also(ModelLoadError, kind)(message)


def load_error_like_onnxruntime(source: Any, message: str) -> ModelLoadError:
    """For a model autoclust could not read: our message, typed as onnxruntime's error for
    the same source (onnxruntime is asked to load it; None when it can)."""
    try:
        ORIGINAL_SESSION(source, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - its exception type is what we want
        return load_error(message, exc)
    return ModelLoadError(message)


def terminated_error(where: str) -> errors.RunTerminatedError:
    """What run() raises when RunOptions.terminate is set: onnxruntime's Fail and message."""
    return errors.also(errors.RunTerminatedError, Fail)(
        f"Exiting due to terminate flag being set to true (autoclust: stopped before {where})")


class Segment:
    """An onnxruntime session over a sub-model, run by name lists."""

    def __init__(self, model: onnx.ModelProto, options: ort.SessionOptions | None,
                 providers: Any = None, provider_options: Any = None, name: str = "segment",
                 input_names: list[str] | None = None, output_names: list[str] | None = None,
                 external: dict[str, np.ndarray] | None = None):
        self.name = name
        # what a rebuild without buffer reuse takes (_without_buffer_reuse): the model's
        # weights are external arrays the graph holds anyway, so this keeps a small proto
        self._source = (model, options, providers, provider_options, external)
        self._disabled: list[str] = []  # optimizers a failed run turned off (_without_optimizers)
        if external:  # a copy (add_external_initializers mutates it), spinning off
            options = sub_session_options(options)
        self.session = create_session(model, options, providers, provider_options, external)
        # Feeds and fetches go by name, so any order the caller keeps works.
        self.input_names = input_names or [i.name for i in self.session.get_inputs()]
        self.output_names = output_names or [o.name for o in self.session.get_outputs()]
        # bfloat16, float8, int4, ...: onnxruntime takes and returns them only as OrtValues.
        self.ort_values = values.needs_ort_values(self.session)

    @property
    def session(self) -> Any:
        """The onnxruntime session (replaceable: its run entry point follows)."""
        return self._session

    @session.setter
    def session(self, session: Any) -> None:
        self._session = session
        self._run = direct_run(session)

    def run(self, inputs: list[np.ndarray], run_options: Any = None) -> list[np.ndarray]:
        """Run with inputs in input_names order; outputs in output_names order."""
        return self.run_feeds(dict(zip(self.input_names, inputs)), run_options)

    def run_feeds(self, feeds: dict[str, Any], run_options: Any = None) -> list[np.ndarray]:
        """Run on feeds by name (optional inputs may be left out); outputs in order."""
        try:
            if self.ort_values:
                return values.run(self.session, self.output_names, feeds, run_options)
            return self._run(self.output_names, feeds, run_options)
        except Fail as exc:
            guilty = failed_optimizers(exc, self._disabled)
            if guilty and self._source is not None:
                self._without_optimizers(exc, guilty)
            elif PLANNER_FAILURE not in str(exc) or self._source is None:
                raise
            else:
                self._without_buffer_reuse(exc)
        return self.run_feeds(feeds, run_options)

    def _without_optimizers(self, exc: BaseException, guilty: list[str]) -> None:
        """Rebuild the session without the optimizers whose inserted node failed a run,
        warning once each: MatMulAddFusion's Reshape of A to 2-D infers -1 wrongly for a
        zero-size A ({2, 0, 4} to {2, 4}: fuzz 165/2033's kin), which plain onnxruntime
        fails on at run time too; without the fusion the model answers."""
        self._disabled += guilty
        warn_optimizer_failure(exc, self.name, guilty, stacklevel=6)
        model, options, providers, provider_options, external = self._source
        if external:  # a fresh copy, as __init__ makes
            options = sub_session_options(options)
        self.session = create_session(model, options, providers, provider_options, external,
                                      disable=self._disabled)

    def _without_buffer_reuse(self, exc: BaseException) -> None:
        """Rebuild the session with the memory planner's buffer reuse off, once, warning:
        onnxruntime 1.31's planner hands a float16 op's empty buffer to a node of another
        shape ("Shape mismatch attempting to re-use buffer. {0} != {1}": a Softmax over a
        [0] tensor beside a [1] one, fuzz 119/1338; 80/163, 80/591), an error of its own
        that the same session without reuse does not make. onnxruntime over the whole
        model (another plan) may only warn where a segment of it fails; the segment then
        answers as onnxruntime does."""
        model, options, providers, provider_options, external = self._source
        self._source = None
        warn_planner_failure(exc, self.name, stacklevel=5)
        self.session = create_session(model, without_buffer_reuse(options), providers,
                                      provider_options, external, disable=self._disabled)


def failed_optimizers(exc: BaseException, disabled: Sequence[str]) -> list[str]:
    """The graph optimizers (not in `disabled`) whose inserted node (INSERTED_BY) a load
    error ("Node (gemm_input_reshape) Op (Reshape) ...") or a run's ("... running Reshape
    node. Name:'gemm_input_reshape' Status Message: ...") names, each once."""
    text = str(exc)
    return list(dict.fromkeys(o for node, o in INSERTED_BY.items() if o not in disabled and
                              (f"Node ({node})" in text or f"Name:'{node}'" in text)))


def warn_optimizer_failure(exc: BaseException, where: str, guilty: list[str],
                           stacklevel: int) -> None:
    """The one warning for a session rebuilt without the optimizers a run failed in."""
    first = str(exc).rsplit("Status Message: ", 1)[-1].split("\n")[0][-160:]
    warnings.warn(f"autoclust: onnxruntime failed a run of {where} in a node that "
                  f"{', '.join(guilty)} inserted ({first}); it runs without it from now on",
                  RuntimeWarning, stacklevel=stacklevel)


def warn_planner_failure(exc: BaseException, where: str, stacklevel: int) -> None:
    """The one warning for a session rebuilt without buffer reuse (PLANNER_FAILURE)."""
    # "... Status Message: <source>:87 virtual OrtValue* ... FAIL : Shape mismatch attempting
    # to re-use buffer. {2,5,0} != {2,5,1}. Validate usage of dim_value ...": the mismatch
    first = str(exc).rsplit("FAIL : ", 1)[-1].split(". Validate")[0].strip()[:160]
    warnings.warn(f"autoclust: onnxruntime's memory planner failed in {where} ({first}); "
                  "it runs with buffer reuse off from now on", RuntimeWarning,
                  stacklevel=stacklevel)


def direct_run(session: Any) -> Any:
    """session.run, or on a CPU-only session its C entry point.

    onnxruntime's Python run() re-checks that every input is fed, that OrtValues belong
    to the session and WebGPU graph capture, and retries on another provider after an
    EPFail: ~1-2 us a run, and nothing of it applies to a CPU session fed NumPy arrays by
    name lists built from its own inputs (missing feeds still raise from C).
    """
    try:
        cpu_only = session.get_providers() == ["CPUExecutionProvider"]
        c_run = session._sess.run
    except AttributeError:  # not onnxruntime's class (a test double, a future version)
        return session.run
    return c_run if cpu_only else session.run
