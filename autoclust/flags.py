"""AUTOCLUST_FLAGS: one parser for the environment variable and keyword overrides.

Modelled on TF_XLA_FLAGS: space-separated `--name=value`; booleans as `--name`,
`--name=true` or `--name=false`. Keyword overrides use the same names
(`InferenceSession(path, auto_jit=1, must_compile=True)`) and win over the env var.
An unknown flag or a bad value raises FlagError listing the known flags.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Callable, Sequence
from typing import Any

from autoclust import registry
from autoclust.errors import FlagError

ENV_VAR = "AUTOCLUST_FLAGS"


@dataclasses.dataclass(frozen=True)
class FlagSpec:
    name: str
    type: type  # bool, int, str or list (comma-separated strings)
    default: Any
    help: str
    choices: tuple | Callable[[], Sequence] = ()  # allowed values, or a function giving them
    changes_code: bool = False  # part of the compile-cache key

    def allowed(self) -> tuple:
        return tuple(self.choices()) if callable(self.choices) else self.choices


SPECS: tuple[FlagSpec, ...] = (
    FlagSpec("auto_jit", int, 2, "0: off (plain onnxruntime); 1: cluster only what the cost "
             "model expects to win; 2: cluster every legal cluster", (0, 1, 2)),
    FlagSpec("device", str, "cpu", "where clusters run: cpu (LLVM), gpu (CUDA via CuPy), "
             "interpreter (NumPy reference, for debugging), or a backend registered under "
             "the autoclust.backends entry point", lambda: registry.device_names(),
             changes_code=True),
    FlagSpec("min_cluster_size", int, 4, "smallest cluster kept (Identity, Constant and pure "
             "shape ops count 0)"),
    FlagSpec("max_cluster_size", int, 0, "largest cluster in nodes; 0 means no limit"),
    FlagSpec("clustering_fuel", int, -1, "only the first N candidates (stable order) may "
             "cluster; -1 means unlimited. For bisecting a miscompile"),
    FlagSpec("ops_to_cluster", list, (), "only these ops or groups may cluster (ELEMENTWISE, "
             "REDUCTION, NORMALIZATION, LAYOUT, SHAPE, MATMUL, FUSIBLE); empty means all"),
    FlagSpec("cluster_exclude_ops", list, (), "ops or groups never clustered"),
    FlagSpec("dump_to", str, "", "directory for clustering and per-cluster dumps"),
    FlagSpec("dump_inputs", bool, False, "with --dump_to, save each cluster's first real "
             "inputs as cluster_NNNN.inputs.npz"),
    FlagSpec("dump_llvm", bool, True, "with --dump_to, write .ll and .s for CPU clusters"),
    FlagSpec("cache_dir", str, "", "persistent cache of compiled code"),
    FlagSpec("torch_cache_dir", str, "auto", "where torch.compile(backend=\"autoclust\") "
             "keeps compiled code when --cache_dir is not set, as inductor keeps its own: "
             "auto is $XDG_CACHE_HOME/autoclust/torch (~/.cache/autoclust/torch); empty "
             "keeps nothing"),
    FlagSpec("cache_trusted", bool, False, "use a --cache_dir that other users can write "
             "(refused otherwise: its entries are code that every process using it runs)"),
    FlagSpec("threads", int, 0, "threads for compiled kernels and onnxruntime; 0 means "
             "onnxruntime's default (all cores)", changes_code=True),
    FlagSpec("cpu_helpers", str, "native", "helper threads of CPU kernels split over "
             "--threads: native (pthreads, futex; Linux x86-64, else python) or python",
             choices=("native", "python")),
    FlagSpec("cpu_allow_spinning", bool, True, "native helpers poll for the next split "
             "while a cluster runs (at SCHED_IDLE: only otherwise idle cores) instead of "
             "sleeping between splits; onnxruntime's session.intra_op.allow_spinning for our "
             "helpers (ONNX exports 0-3% faster; not in plans calling oneDNN, whose "
             "OpenMP threads it slowed). Off: helpers sleep between splits"),
    FlagSpec("cpu_packed_gemm", bool, True, "our prefetching GEMM over packed constant "
             "weights (backends/cpu/packed.py) competes with MLAS and oneDNN for large "
             "MatMul/Gemm calls, measured in the plan; off: MLAS and oneDNN only"),
    FlagSpec("cpu_gemm_epilogues", bool, True, "where our packed GEMM takes a call, it "
             "computes the call's epilogue (bias, GELU, layer scale, residual Add: the "
             "elementwise kernel after it) in its store, and the libraries it competes "
             "with run that kernel after the call (backends/cpu/packed_epilogue.py); off: "
             "the epilogue is a kernel of its own after the call"),
    FlagSpec("must_compile", bool, False, "raise NotCompilableError instead of falling back"),
    FlagSpec("disable_passes", list, (), "cluster optimizer passes to skip, by name",
             changes_code=True),
    FlagSpec("max_buffer_bytes", int, 0, "largest value a cluster may compute, in bytes: "
             "a bigger one (or a negative dim) raises InvalidShapeError naming the node "
             "before anything is allocated; 0 means this machine's physical memory"),
    FlagSpec("check_bounds", bool, False, "compiled CPU kernels check every load and store "
             "against its buffer and raise OutOfBoundsError naming the kernel and buffer "
             "(slower; the fuzzer runs with it)", changes_code=True),
    FlagSpec("check_numerics", bool, False, "check cluster outputs for NaN/inf and warn "
             "naming the cluster"),
    FlagSpec("verify_passes", bool, False, "run Graph.verify() after every pass (debug)"),
    FlagSpec("megamorphic_compiles", int, 10, "a cluster compiled more than this many times "
             "with fewer than 50 runs per compile falls back to onnxruntime"),
    FlagSpec("symbolic_dims", bool, True, "compile a cluster once for every value of the "
             "input dims the model leaves open (a sequence length): the code reads them at "
             "run time; off, every new shape compiles again"),
    FlagSpec("fast_math", bool, False, "allow reassociation in elementwise math (reductions "
             "always reassociate; LLVM may assume no NaN or inf) and, on the CPU, GELU inside "
             "its GEMM as oneDNN's approximation (~2e-4 relative error)", changes_code=True),
    FlagSpec("log", bool, False, "print one line per compile and fallback to stderr, and "
             "plain progress lines where no terminal shows a progress bar"),
    FlagSpec("cuda_graphs", bool, True, "--device=gpu: replay a whole run as one CUDA graph "
             "per input signature when every step runs on the GPU without cuBLAS calls"),
    FlagSpec("allow_tf32", bool, False, "--device=gpu: float32 GEMMs may use TF32 tensor "
             "cores (faster, ~1e-3 relative error); off, they match the CPU",
             changes_code=True),
    FlagSpec("gpu_mma_attention", bool, False, "--device=gpu: float16/bfloat16 fused "
             "attention (head dims multiples of 16) on tensor cores, mma.sync on sm_80 and "
             "later; off until measured on a GPU, the CUDA-core kernel runs it",
             changes_code=True),
    FlagSpec("async_compile", bool, False, "compile a cluster for a new signature in the "
             "background and run it with onnxruntime meanwhile, so run() never waits for a "
             "compile (as TF's tf_xla_async_compilation)"),
    FlagSpec("freeze_params", bool, True, "torch.compile: parameters and buffers of an "
             "inference graph are constants of its clusters (weight transposes fold, GEMMs "
             "prepack), guarded by identity, version and data pointer; a changed one "
             "rebuilds the graph"),
    FlagSpec("autotune", bool, True, "measured placement: at the first runs of a new "
             "signature time each compiled cluster against onnxruntime on the same subgraph "
             "and inputs, and keep the faster (decisions in explain and --cache_dir)"),
    FlagSpec("autotune_budget_ms", int, 3000, "the most time a session spends measuring "
             "its clusters' placement (onnxruntime's sessions and runs beside the compiled "
             "ones); the whole model's trial against onnxruntime has as much again"),
    FlagSpec("inject_bug", str, "", "TESTING ONLY: accuracy:OP, compile_error:OP or crash:OP "
             "makes the compiled code of the first OP node of each cluster wrong, fail to "
             "compile, or abort (autoclust/kernel/inject.py); for testing bisect and minify",
             changes_code=True),
)

_BY_NAME = {s.name: s for s in SPECS}


@dataclasses.dataclass(frozen=True)
class Flags:
    """Parsed flag values; attribute per flag (flags.auto_jit, flags.dump_to, ...)."""

    values: tuple  # ((name, value), ...) sorted, hashable

    def __getattr__(self, name: str) -> Any:
        for key, value in object.__getattribute__(self, "values"):
            if key == name:
                return value
        raise AttributeError(name)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)

    def replace(self, **overrides: Any) -> Flags:
        """A copy with some flags changed (values are validated)."""
        merged = self.as_dict()
        for name, value in overrides.items():
            merged[name] = _convert(_spec(name), value)
        return Flags(tuple(sorted(merged.items())))

    def code_key(self) -> tuple:
        """The flags that change generated code, for compile-cache keys."""
        return tuple((n, v) for n, v in self.values if _BY_NAME[n].changes_code)

    def to_string(self) -> str:
        """Non-default flags in AUTOCLUST_FLAGS syntax."""
        parts = []
        for name, value in self.values:
            if value == _BY_NAME[name].default:
                continue
            if isinstance(value, tuple):
                value = ",".join(value)
            elif isinstance(value, bool):
                value = "true" if value else "false"
            parts.append(f"--{name}={value}")
        return " ".join(parts)


def _known() -> str:
    return ", ".join(f"--{s.name}" for s in SPECS)


def _spec(name: str) -> FlagSpec:
    spec = _BY_NAME.get(name)
    if spec is None:
        raise FlagError(f"unknown flag --{name}; known flags: {_known()}")
    return spec


def _convert(spec: FlagSpec, raw: Any) -> Any:
    value: Any
    if spec.type is bool:
        if isinstance(raw, bool):
            value = raw
        elif str(raw).lower() in ("1", "true", "yes", "on"):
            value = True
        elif str(raw).lower() in ("0", "false", "no", "off"):
            value = False
        else:
            raise FlagError(f"--{spec.name} takes true or false, got {raw!r}")
    elif spec.type is int:
        if isinstance(raw, bool):
            raise FlagError(f"--{spec.name} takes an integer, got {raw!r}")
        try:
            value = int(raw)
        except (TypeError, ValueError):
            raise FlagError(f"--{spec.name} takes an integer, got {raw!r}") from None
    elif spec.type is list:
        if isinstance(raw, str):
            items = [p.strip() for p in raw.split(",")]
        else:
            items = [str(p).strip() for p in raw]
        value = tuple(p for p in items if p)
    else:
        value = str(raw)
    if spec.choices and value not in spec.allowed():
        allowed = ", ".join(str(c) for c in spec.allowed())
        raise FlagError(f"--{spec.name}={raw} is not one of: {allowed}")
    if spec.type is int and value < -1:
        raise FlagError(f"--{spec.name} must be >= -1, got {value}")
    if spec.type is list and value and spec.name in _NAME_CHECKS:
        _NAME_CHECKS[spec.name](spec.name, value)
    if spec.name == "inject_bug":
        from autoclust.kernel import inject
        inject.parse(value)  # FlagError for a malformed KIND:OP
    return value


def _op_names(flag: str, names: tuple) -> None:
    """--ops_to_cluster / --cluster_exclude_ops: op names of the op table or op groups."""
    from autoclust import ops  # lazily: the op table is not needed to parse other flags
    table = ops.all_ops()
    known_ops = sorted({d.op for d in table})
    groups = sorted(set().union(*(d.group_names() for d in table)))
    unknown = [n for n in names if n not in known_ops and n.upper() not in groups]
    if unknown:
        raise FlagError(f"--{flag}: unknown op or group {', '.join(map(repr, unknown))}"
                        f"{_close(unknown, known_ops + groups)}; groups: {', '.join(groups)}; "
                        f"ops: {', '.join(known_ops)}")


def _pass_names(flag: str, names: tuple) -> None:
    """--disable_passes: names of the cluster optimizer's passes."""
    from autoclust.passes.optimize import LOWERING_PASSES, PASSES
    known = [name for name, _ in PASSES] + list(LOWERING_PASSES)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise FlagError(f"--{flag}: unknown pass {', '.join(map(repr, unknown))}"
                        f"{_close(unknown, known)}; passes: {', '.join(known)}")


def _close(unknown: list[str], known: list[str]) -> str:
    import difflib
    near = [m for n in unknown for m in difflib.get_close_matches(n, known, n=1)]
    return f" (did you mean {', '.join(map(repr, near))}?)" if near else ""


_NAME_CHECKS = {"ops_to_cluster": _op_names, "cluster_exclude_ops": _op_names,
                "disable_passes": _pass_names}


def parse_string(text: str) -> dict[str, Any]:
    """Parse `--a=1 --b` into {name: converted value}; raises FlagError."""
    out: dict[str, Any] = {}
    try:
        tokens = shlex.split(text or "")
    except ValueError as exc:
        raise FlagError(f"cannot parse {ENV_VAR}={text!r}: {exc}") from None
    for token in tokens:
        if not token.startswith("--"):
            raise FlagError(f"flags look like --name=value, got {token!r}; known flags: {_known()}")
        name, eq, raw = token[2:].partition("=")
        spec = _spec(name.replace("-", "_"))
        if not eq:
            if spec.type is not bool:
                raise FlagError(f"--{spec.name} needs a value (--{spec.name}=...)")
            raw = "true"
        out[spec.name] = _convert(spec, raw)
    return out


def parse(env: str | None = None, **overrides: Any) -> Flags:
    """Flags from AUTOCLUST_FLAGS (or `env` when given) plus keyword overrides."""
    text = os.environ.get(ENV_VAR, "") if env is None else env
    values = {s.name: s.default for s in SPECS}
    values.update(parse_string(text))
    for name, raw in overrides.items():
        if raw is None:
            continue
        spec = _spec(name)
        values[spec.name] = _convert(spec, raw)
    return Flags(tuple(sorted(values.items())))


def env_requests_jit() -> bool:
    """True when AUTOCLUST_FLAGS is set, not empty and does not say --auto_jit=0 (auto_jit
    defaults to 2 there as everywhere); used by the import hook."""
    text = os.environ.get(ENV_VAR, "")
    if not text.strip():
        return False
    try:
        return parse_string(text).get("auto_jit", _BY_NAME["auto_jit"].default) > 0
    except FlagError:
        return True  # let the session raise the FlagError with the full message


def table() -> str:
    """Every flag with its default and meaning, for `autoclust flags`."""
    rows = []
    for s in SPECS:
        default = s.default
        if isinstance(default, tuple):
            default = ",".join(default) or "''"
        elif default == "":
            default = "''"
        meaning = s.help
        if callable(s.choices):
            meaning += f" (here: {', '.join(s.allowed())})"
        rows.append((f"--{s.name}", s.type.__name__, str(default), meaning))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    w2 = max(len(r[2]) for r in rows)
    lines = [f"{'flag':<{w0}}  {'type':<{w1}}  {'default':<{w2}}  meaning"]
    lines += [f"{a:<{w0}}  {b:<{w1}}  {c:<{w2}}  {d}" for a, b, c, d in rows]
    return "\n".join(lines)
