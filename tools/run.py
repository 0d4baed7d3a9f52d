"""`autoclust run`, `autoclust explain` and `autoclust exec`."""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
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
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise InvalidInputError(f"{what} takes NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def dim_value(name: str, overrides: dict[str, int]) -> int:
    if name in overrides:
        return overrides[name]
    low = name.lower()
    for key, value in DIM_DEFAULTS:
        if low == key or (len(key) > 1 and key in low):
            return value
    return DEFAULT_DIM


def generate_inputs(model: onnx.ModelProto, dims: dict[str, int] | None = None,
                    seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for every required model input: symbolic dims from `dims` or defaults.

    Zoo models get their own generator (valid ids, masks); other models get normal floats,
    small non-negative ints (safe as indices) and random bools.
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
        if vi.name in inits or not vi.type.HasField("tensor_type"):
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
    return load_model_proto(path)


def _session_kwargs(flags_text: str | None) -> dict[str, Any]:
    from autoclust import flags
    if flags_text is None:
        return {}
    return flags.parse_string(flags_text)


def median_ms(fn: Any, repeat: int) -> float:
    """Median wall time of fn() in ms over `repeat` runs."""
    times = []
    for _ in range(max(repeat, 1)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def main(args: argparse.Namespace) -> int:
    """autoclust run MODEL ..."""
    import autoclust
    model = load_model(args.model)
    dims = {k: int(v) for k, v in parse_assignments(args.dim, "--dim").items()}
    feeds = generate_inputs(model, dims, args.seed)
    for name, path in parse_assignments(args.input, "--input").items():
        feeds[name] = np.load(path, allow_pickle=False)
    kwargs = _session_kwargs(args.flags)
    t0 = time.perf_counter()
    sess = autoclust.InferenceSession(args.model, **kwargs)
    t_create = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    outs = sess.run(None, feeds)
    t_first = (time.perf_counter() - t0) * 1e3
    t_run = median_ms(lambda: sess.run(None, feeds), args.repeat)
    print(f"model: {args.model}")
    for name, x in feeds.items():
        print(f"  input  {name}: {x.dtype}{list(x.shape)}")
    for meta, y in zip(sess.get_outputs(), outs):
        y = np.asarray(y)
        print(f"  output {meta.name}: {y.dtype}{list(y.shape)}")
    print(f"session {t_create:.1f} ms, first run {t_first:.1f} ms (includes compiles), "
          f"median run {t_run:.3f} ms over {args.repeat}")
    if sess.plan is not None:
        print(sess.explain().split("\n", 1)[0])
        for c in sess.stats()["clusters"]:
            extra = f", fell back: {c['fallback']}" if c["fallback"] else ""
            print(f"  {c['name']}: {c['compiles']} compile(s), kernels {c['kernels']}{extra}")
    if args.compare_ort:
        return _compare_ort(args.model, feeds, outs, t_run, args.repeat, sess)
    return 0


def _compare_ort(path: str, feeds: dict, outs: list, t_run: float, repeat: int,
                 sess: Any) -> int:
    from autoclust.backends import ort as ort_backend
    ref_sess = ort_backend.create_session(path, None)
    ref = ref_sess.run(None, feeds)
    t_ort = median_ms(lambda: ref_sess.run(None, feeds), repeat)
    worst = 0.0
    for meta, a, b in zip(sess.get_outputs(), outs, ref):
        a, b = np.asarray(a), np.asarray(b)
        err = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size \
            else 0.0
        worst = max(worst, err)
        print(f"  {meta.name}: max abs diff vs onnxruntime {err:.3g}")
    print(f"onnxruntime median {t_ort:.3f} ms; ratio onnxruntime/autoclust "
          f"{t_ort / max(t_run, 1e-9):.2f}x")
    return 0 if worst <= 1e-3 else 1


def explain_main(args: argparse.Namespace) -> int:
    """autoclust explain MODEL [--json] [--flags ...]"""
    import json

    from autoclust.importers.onnx import import_model

    from autoclust import explain, flags, registry
    from autoclust.clustering import cluster
    model = load_model(args.model)
    f = flags.parse(**_session_kwargs(args.flags))
    graph = import_model(model)
    backend = registry.get_backend(f.device)
    plan = cluster(graph, f, backend.why_not)
    if args.json:
        print(json.dumps(explain.explain_json(plan), indent=2))
    else:
        print(explain.explain_text(plan))
    return 0


def exec_main(args: argparse.Namespace) -> int:
    """autoclust exec script.py args...: the script runs with auto-jit on."""
    from autoclust import flags, hook
    if "auto_jit" not in os.environ.get(flags.ENV_VAR, ""):
        os.environ[flags.ENV_VAR] = (os.environ.get(flags.ENV_VAR, "") + " --auto_jit=2").strip()
    flags.parse()  # a bad AUTOCLUST_FLAGS fails here, before the script starts
    hook.install()
    if not os.path.exists(args.script):
        raise FileNotFoundError(f"no such script: {args.script}")
    sys.argv = [args.script] + list(args.args)
    runpy.run_path(args.script, run_name="__main__")
    return 0
