"""`autoclust run`, `autoclust explain` and `autoclust exec`."""

from __future__ import annotations

import argparse
import difflib
import os
import runpy
import sys
import time
import traceback
import zipfile
from typing import Any

import numpy as np
import onnx

from autoclust.errors import InvalidInputError, ModelLoadError

# Symbolic dims get these values unless --dim overrides them (matched case-insensitively
# by substring; anything else gets DEFAULT_DIM).
DIM_DEFAULTS = (("batch", 2), ("seq", 16), ("len", 16), ("time", 16), ("height", 32),
                ("width", 32), ("n", 1024))
DEFAULT_DIM = 4


def parse_assignments(items: list[str], what: str) -> dict[str, str]:
    """{NAME: VALUE} from ["NAME=VALUE", ...]; InvalidInputError naming `what` otherwise."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise InvalidInputError(f"{what} takes NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def symbolic_dims(model: onnx.ModelProto) -> list[str]:
    """The symbolic dim names of the model's inputs, in order of first appearance."""
    inits = {i.name for i in model.graph.initializer}
    names: dict[str, None] = {}
    for vi in model.graph.input:
        if vi.name not in inits and vi.type.HasField("tensor_type"):
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_param") and d.dim_param:
                    names[d.dim_param] = None
    return list(names)


def _unknown(kind: str, name: str, known: list[str], what: str) -> InvalidInputError:
    """`... has no dim 'seqq' (did you mean 'seq'?); its dims are: batch, seq`."""
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    listing = ", ".join(known) if known else "none"
    return InvalidInputError(f"{what} {name}: the model has no {kind} {name!r}{hint}; "
                             f"its {kind}s are: {listing}")


def parse_dims(items: list[str], model: onnx.ModelProto) -> dict[str, int]:
    """--dim NAME=VALUE items checked against the model's symbolic dims."""
    known = symbolic_dims(model)
    dims = {}
    for name, value in parse_assignments(items, "--dim").items():
        if name not in known:
            raise _unknown("symbolic dim", name, known, "--dim")
        try:
            dims[name] = int(value)
        except ValueError:
            raise InvalidInputError(f"--dim {name}: the size must be an integer, got "
                                    f"{value!r}") from None
        if dims[name] < 0:
            raise InvalidInputError(f"--dim {name}: the size must be >= 0, got {value}")
    return dims


def load_array(what: str, path: str) -> Any:
    """np.load(path) (an array or an NpzFile); InvalidInputError when it is neither."""
    if not os.path.isfile(path):
        raise InvalidInputError(f"{what}: no such file: {path}")
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic != b"\x93NUMPY" and magic[:4] != b"PK\x03\x04":
        raise InvalidInputError(f"{what}: {path} is not a .npy or .npz file (save arrays "
                                "with numpy.save or numpy.savez)")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        first = str(exc).split(". ", 1)[0].split("\n", 1)[0]
        raise InvalidInputError(f"{what}: cannot read {path}: {first}") from None


def load_feeds(items: list[str], model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Feeds from --input NAME=FILE.npy items (or FILE.npz: every array in it by name)."""
    inits = {i.name for i in model.graph.initializer}
    known = [vi.name for vi in model.graph.input if vi.name not in inits]
    feeds: dict[str, np.ndarray] = {}
    for item in items:
        if "=" not in item and item.endswith(".npz"):
            data = load_array(f"--input {item}", item)
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise InvalidInputError(f"--input {item}: not an .npz archive")
            with data:
                new = {k: data[k] for k in data.files}
        else:
            new = {}
            for name, path in parse_assignments([item], "--input").items():
                array = load_array(f"--input {name}", path)
                if not isinstance(array, np.ndarray):
                    array.close()
                    raise InvalidInputError(f"--input {name}: {path} holds several arrays "
                                            "(an .npz); pass it alone, --input FILE.npz")
                new[name] = array
        for name in new:
            if name not in known:
                raise _unknown("input", name, known, "--input")
        feeds.update(new)
    return feeds


def dim_value(name: str, overrides: dict[str, int]) -> int:
    """The size of symbolic dim `name`: --dim's, else a default guessed from the name."""
    if name in overrides:
        return overrides[name]
    low = name.lower()
    for key, value in DIM_DEFAULTS:
        if low == key or (len(key) > 1 and key in low):
            return value
    return DEFAULT_DIM


def generate_inputs(model: onnx.ModelProto, dims: dict[str, int] | None = None,
                    seed: int = 0, skip: set[str] | None = None) -> dict[str, np.ndarray]:
    """Inputs for every required model input: symbolic dims from `dims` or defaults.

    Zoo models get their own generator (valid ids, masks); other models get normal floats,
    small non-negative ints (safe as indices) and random bools. Inputs in `skip` (given
    by the user) are not generated.
    """
    dims = dict(dims or {})
    try:
        from autoclust.models import zoo
        if zoo.zoo_name(model):
            return zoo.feeds(model, dims=dims or None, seed=seed)
    except (ImportError, InvalidInputError):
        pass  # e.g. a dumped cluster of a zoo model with dims the zoo does not name
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits or vi.name in (skip or ()) or not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            else:
                shape.append(dim_value(d.dim_param or "?", dims))
        if dtype.kind == "f":
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[vi.name] = rng.integers(0, 2, size=shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[vi.name] = rng.random(shape) < 0.5
        else:
            raise InvalidInputError(f"cannot generate input {vi.name!r} of dtype {dtype}; "
                                    "pass it with --input NAME=FILE.npy")
    return feeds


def load_model(path: str) -> onnx.ModelProto:
    from autoclust.importers.onnx import load_model_proto
    if not os.path.exists(path):
        raise ModelLoadError(f"no such model file: {path}")
    if os.path.isdir(path):
        raise ModelLoadError(f"{path} is a directory, not an .onnx model file")
    return load_model_proto(path)


def _session_kwargs(flags_text: str | None) -> dict[str, Any]:
    from autoclust import flags
    if flags_text is None:
        return {}
    return flags.parse_string(flags_text)


BLOCK = 10  # timed runs per side per round when comparing with onnxruntime


def median_ms(fn: Any, repeat: int, warmup: int = 3) -> float:
    """Median wall time of fn() in ms over `repeat` runs after `warmup` untimed ones (the
    runs right after the first still warm caches and wake threads)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(max(repeat, 1)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def alternating_ms(sides: dict[str, Any], repeat: int) -> dict[str, float]:
    """Median ms per side over `repeat` timed runs each, in alternating blocks of BLOCK
    (each after an untimed run), so load from other processes hits both sides alike."""
    from autoclust.tools.bench import timing
    rounds = max(1, -(-repeat // BLOCK))
    times = timing.alternate(sides, rounds, min(BLOCK, max(repeat, 1)))
    return {name: timing.median_ms(t) for name, t in times.items()}


def main(args: argparse.Namespace) -> int:
    """autoclust run MODEL ..."""
    import autoclust
    model = load_model(args.model)
    kwargs = _session_kwargs(args.flags)
    given = load_feeds(args.input, model)
    feeds = generate_inputs(model, parse_dims(args.dim, model), args.seed, skip=set(given))
    feeds.update(given)
    t0 = time.perf_counter()
    sess = autoclust.InferenceSession(args.model, **kwargs)
    t_create = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    outs = sess.run(None, feeds)
    t_first = (time.perf_counter() - t0) * 1e3
    ref_sess = _ort_session(args.model, sess) if args.compare_ort else None
    # Timing starts at the steady state, as the benchmarks' does: the runs right after the
    # first prepack GEMM weights in the background and measure placement (onnxruntime's
    # side too), 1.5-3x a steady run; timed, they read ConvNeXt at 0.34x over 20 runs.
    from autoclust.tools.bench import timing
    settle_runs = timing.settle(sess, feeds)
    if ref_sess is None:
        t_run = median_ms(lambda: sess.run(None, feeds), args.repeat)
    else:
        medians = alternating_ms({"autoclust": lambda: sess.run(None, feeds),
                                  "onnxruntime": lambda: ref_sess.run(None, feeds)},
                                 args.repeat)
        t_run, t_ort = medians["autoclust"], medians["onnxruntime"]
    print(f"model: {args.model}")
    for name, x in feeds.items():
        print(f"  input  {name}: {x.dtype}{list(x.shape)}")
    for meta, y in zip(sess.get_outputs(), outs):
        y = np.asarray(y)
        print(f"  output {meta.name}: {y.dtype}{list(y.shape)}")
    interpreted = sess.flags.device == "interpreter"
    work = "optimizing clusters for the interpreter" if interpreted else "compiles"
    print(f"session {t_create:.1f} ms, first run {t_first:.1f} ms (includes {work}), "
          f"settled by run {1 + settle_runs}, median run {t_run:.4g} ms over {args.repeat}")
    print(sess.explain().split("\n", 1)[0])
    for c in sess.stats()["clusters"]:
        print(f"  {c['name']}: {cluster_line(c, interpreted)}")
    if ref_sess is not None:
        return _compare_ort(ref_sess, feeds, outs, t_run, t_ort, sess)
    return 0


def cluster_line(stats: dict[str, Any], interpreted: bool) -> str:
    """`compiled once, 5 kernels` / `interpreted, 12 nodes` / `fell back: ...`."""
    from autoclust.text import plural
    counts = stats["kernels"]
    if interpreted:
        text = "interpreted, " + ", ".join(plural(n, "node") for n in counts)
    elif len(counts) == 1:
        text = f"compiled once, {plural(counts[0], 'kernel')}"
    else:
        text = f"compiled {len(counts)} times, kernels {', '.join(map(str, counts))}"
    if not counts:
        text = "not compiled"
    if stats["fallback"]:
        text += f"; fell back to onnxruntime: {stats['fallback']}"
    return text


def _ort_session(path: str, sess: Any) -> Any:
    """onnxruntime on the same model with the same threads as autoclust's kernels,
    ORT_ENABLE_ALL and spinning off (its spinning threads would steal the cores from the
    autoclust runs alternating with it)."""
    from autoclust.tools.bench import timing
    threads = sess.flags.threads if sess.flags.threads > 0 else (os.cpu_count() or 1)
    return timing.ort_session(path, threads)


def _compare_ort(ref_sess: Any, feeds: dict, outs: list, t_run: float, t_ort: float,
                 sess: Any) -> int:
    ref = ref_sess.run(None, feeds)
    worst = 0.0
    for meta, a, b in zip(sess.get_outputs(), outs, ref):
        a, b = np.asarray(a), np.asarray(b)
        err = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size \
            else 0.0
        worst = max(worst, err)
        print(f"  {meta.name}: max abs diff vs onnxruntime {err:.3g}")
    print(f"onnxruntime median {t_ort:.4g} ms (same threads, spinning off, runs alternated "
          f"in blocks of {BLOCK}); ratio onnxruntime/autoclust {t_ort / max(t_run, 1e-9):.2f}x")
    return 0 if worst <= 1e-3 else 1


def explain_main(args: argparse.Namespace) -> int:
    """autoclust explain MODEL [--json] [--html FILE] [--flags ...]"""
    import json

    from autoclust.importers.onnx import import_model

    from autoclust import flags, registry
    from autoclust.clustering.partition import cluster
    from autoclust.report import explain
    model = load_model(args.model)
    f = flags.parse(**_session_kwargs(args.flags))
    graph = import_model(model)
    backend = registry.get_backend(f.device)
    plan = cluster(graph, f, backend.why_not)
    if args.html:
        from autoclust.report.dump import to_html
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(to_html(plan))
    if args.json:
        print(json.dumps(explain.explain_json(plan), indent=2))
    else:
        print(explain.explain_text(plan))
    if args.html:
        print(f"wrote {args.html}", file=sys.stderr)
    return 0


def exec_main(args: argparse.Namespace) -> int:
    """autoclust exec script.py args...: the script runs with auto-jit on."""
    from autoclust import flags, hook
    # Check everything before touching this process (environment, onnxruntime's class).
    if not os.path.isfile(args.script):
        raise FileNotFoundError(f"no such script: {args.script}")
    text = os.environ.get(flags.ENV_VAR, "")
    if "auto_jit" not in text:
        text = (text + " --auto_jit=2").strip()
    flags.parse(text)  # a bad AUTOCLUST_FLAGS fails here, before the script starts
    os.environ[flags.ENV_VAR] = text
    hook.install()
    sys.argv = [args.script] + list(args.args)
    try:
        runpy.run_path(args.script, run_name="__main__")
    except Exception as exc:  # noqa: BLE001 - the script's own error: report it as python would
        # Drop our frames (cli, runpy) so the traceback starts in the script.
        tb = exc.__traceback__
        script = os.path.abspath(args.script)
        while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != script:
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
        return 1
    return 0
