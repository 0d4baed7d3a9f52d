"""`autoclust replay DIR/cluster_NNNN`: rerun one dumped cluster on its own.

Loads cluster_NNNN.onnx and its saved inputs (cluster_NNNN.inputs.npz, else generated
from the model's signature), or a repro bundle folder (model.onnx, inputs.npz), then runs
it three ways: compiled on the chosen device, onnxruntime, and the interpreter (the NumPy
reference). Prints max abs/rel error per output and timings; exits 1 when compiled output
differs beyond tolerance. A side that raises is reported, not a traceback: both raising is
agreement (exit 0, a bundle of bad input), one raising a mismatch (exit 1); where
onnxruntime fails on its own (the fuzz arbiter's `run_reference`: its planner's buffer
reuse, a shape error the ONNX reference does not raise), that answer is the reference.
This is our run_hlo_module.
"""

from __future__ import annotations

import argparse
import zipfile
from typing import Any

import numpy as np

from autoclust.errors import InvalidInputError


def resolve(path: str) -> tuple[str, str | None]:
    """(model path, inputs path or None) for DIR/cluster_NNNN, .onnx, the .npz or a bundle."""
    from autoclust.tools.debug.repro import resolve as resolve_target
    return resolve_target(path)


def read_inputs(path: str, names: list[str]) -> dict[str, np.ndarray]:
    """The saved inputs of a dumped cluster (either .npz layout), checked against `names`."""
    from autoclust.report import dump
    try:
        feeds = dump.load_inputs(path)
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise InvalidInputError(f"cannot read saved inputs {path}: {exc}") from None
    missing = [n for n in names if n not in feeds]
    if missing:
        raise InvalidInputError(f"{path} lacks input(s) {', '.join(missing)} of the cluster; "
                                f"it holds: {', '.join(feeds) or 'nothing'}")
    return feeds


def _timed(fn: Any, repeat: int) -> tuple[Any, float]:
    """fn()'s result (a warm-up run) and its median time in ms over `repeat` more runs."""
    from autoclust.tools.run import median_ms
    return fn(), median_ms(fn, repeat)


def _attempt(fn: Any) -> tuple[Any, str]:
    """(fn(), "") or (None, what it raised)."""
    try:
        return fn(), ""
    except Exception as exc:  # noqa: BLE001 - reported as that side's answer
        return None, f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def compare(name: str, got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """Max abs and max relative error of got vs want (NaNs must match)."""
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        raise AssertionError(f"output {name}: shape {got.shape} vs {want.shape}")
    if got.size == 0:
        return 0.0, 0.0
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    nan_mismatch = np.isnan(g) != np.isnan(w)
    if nan_mismatch.any():
        return float("inf"), float("inf")
    same = (g == w) | (np.isnan(g) & np.isnan(w))
    diff = np.where(same, 0.0, np.abs(g - w))
    rel = diff / np.maximum(np.abs(w), 1e-30)
    return float(np.max(diff)), float(np.max(np.where(same, 0.0, rel)))


def _onnxruntime(proto: Any, feeds: dict[str, np.ndarray], names: list[str], repeat: int
                 ) -> tuple[Any, float, str, str]:
    """(outputs or None, ms, what it raised, a note): onnxruntime's answer, or where it
    fails on its own (the fuzz arbiter's run_reference), the reference's."""
    from autoclust.backends import ort as ort_backend
    sess = ort_backend.create_session(proto, None)
    timed, raised = _attempt(
        lambda: _timed(lambda: sess.run(None, {n: feeds[n] for n in names}), repeat))
    if timed is not None:
        return timed[0], timed[1], "", ""
    from autoclust.tools.fuzz import truth  # onnxruntime's own failure, or the inputs' error
    found, _ = _attempt(lambda: truth.run_reference(proto, feeds))
    if found is None:
        return None, 0.0, raised, ""
    return found[1], 0.0, raised, f" (onnxruntime failed on its own: {raised})"


def main(args: argparse.Namespace) -> int:
    """autoclust replay DIR/cluster_NNNN: exit 0 when compiled matches onnxruntime, else 1."""
    from autoclust.importers.onnx import import_model, load_model_proto
    from autoclust.tools.run import generate_inputs

    from autoclust import flags, registry
    from autoclust.compile import compile_cluster
    from autoclust.runtime import interpreter
    from autoclust.text import plural

    model_path, inputs_path = resolve(args.cluster)
    overrides = flags.parse_string(args.flags) if args.flags else {}
    if args.device:
        overrides["device"] = args.device
    f = flags.parse(**overrides)
    proto = load_model_proto(model_path)
    graph = import_model(proto)
    names = [v.name for v in graph.inputs]
    feeds = read_inputs(inputs_path, names) if inputs_path else generate_inputs(proto)
    inputs = [feeds[n] for n in names]
    types = [(x.dtype, x.shape) for x in inputs]
    backend = registry.get_backend(f.device)
    exe, raised = _attempt(lambda: compile_cluster(graph, types, {}, f, backend))
    timed, raised = _attempt(lambda: _timed(lambda: exe.run(inputs), args.repeat)) \
        if exe is not None else (None, raised)
    compiled, t_compiled = timed if timed is not None else (None, 0.0)
    if compiled is not None and registry.policy(backend).device_memory:
        compiled = [backend.to_host(c) for c in compiled]  # device outputs: on the host
    ref, t_ort, ort_raised, note = _onnxruntime(proto, feeds, names, args.repeat)
    interp, interp_raised = _attempt(
        lambda: compile_cluster(graph, types, {}, f, interpreter).run(inputs))
    print(f"replay {model_path} on {f.device} "
          f"({'saved' if inputs_path else 'generated'} inputs){note}")
    if compiled is None or ref is None:
        print(f"  compiled: {raised or 'outputs'}; onnxruntime: {ort_raised or 'outputs'}; "
              f"interpreter: {interp_raised or 'outputs'}")
        both = compiled is None and ref is None
        print("  both raise: agreed" if both else "  MISMATCH: only one side raises")
        return 0 if both else 1
    ok = True
    for k, (v, c, r) in enumerate(zip(graph.outputs, compiled, ref)):
        abs_err, rel_err = compare(v.name, c, r)
        i_abs = compare(v.name, interp[k], r)[0] if interp is not None else float("nan")
        close = np.allclose(np.asarray(c, np.float64), np.asarray(r, np.float64),
                            rtol=args.rtol, atol=args.atol, equal_nan=True) \
            if np.asarray(c).size else True
        ok = ok and close
        print(f"  {v.name}: max abs err {abs_err:.3g}, max rel err {rel_err:.3g} "
              f"(interpreter vs onnxruntime {i_abs:.3g}) {'ok' if close else 'MISMATCH'}")
    count = getattr(exe, "num_kernels", 0)
    if getattr(backend, "NAME", "") == "interpreter":
        what = f"interpreted {t_compiled:.3f} ms ({plural(count, 'node')})"
    else:
        what = f"compiled {t_compiled:.3f} ms ({plural(count, 'kernel')})"
    print(f"{what}, onnxruntime {t_ort:.3f} ms")
    return 0 if ok else 1
