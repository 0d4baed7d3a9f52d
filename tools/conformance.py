"""The official ONNX node test suite against onnxruntime and autoclust.

    python -m autoclust.tools.conformance generate   # run onnxruntime on every node case ->
                                                      # tests/data/ort_node_results.json
    python -m autoclust.tools.conformance summary    # cases, passed default / compiled, wins

The node cases are the ones the installed onnx builds in memory
(onnx.backend.test.loader.load_model_tests(kind="node")). Outputs are compared exactly as
onnx's own runner does (Runner.assert_similar_outputs: same shape and dtype, rtol/atol of
the case, 1e-3/1e-7 by default).

Two autoclust modes:
- default: auto_jit=2, fallback to onnxruntime allowed;
- compiled: must_compile, min_cluster_size=1, for cases whose nodes are all clustering
  candidates (ops in the op table with supported dtypes and static shapes). Cases
  onnxruntime fails but we pass here are wins.
The device is $AUTOCLUST_CONFORMANCE_DEVICE, else "cpu" when that backend is usable, else
"interpreter".
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

DEVICE_ENV = "AUTOCLUST_CONFORMANCE_DEVICE"
RESULTS_FILE = os.path.join("tests", "data", "ort_node_results.json")

# Clustering refusals that are by design: a case with such a node is not a compiled-mode
# case (its other refusals, e.g. a device that cannot lower an op, are failures).
DESIGN_REFUSALS = ("unsupported op", "has a subgraph", "data-dependent output shape",
                   "dtype ")

Outcome = str | None  # None: passed; else a one-line reason


# ---- cases ------------------------------------------------------------------------------

@functools.cache
def node_cases() -> tuple[Any, ...]:
    """The installed onnx's node test cases (TestCase records), sorted by name."""
    from onnx.backend.test.loader import load_model_tests
    with warnings.catch_warnings():  # the case generators overflow casts on purpose
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            cases = load_model_tests(kind="node")
    return tuple(sorted(cases, key=lambda c: c.name))


def default_device() -> str:
    """$AUTOCLUST_CONFORMANCE_DEVICE, else "cpu" when usable, else "interpreter"."""
    env = os.environ.get(DEVICE_ENV)
    if env:
        return env
    from autoclust.errors import FlagError
    from autoclust.registry import get_backend
    try:
        get_backend("cpu")
    except FlagError:
        return "interpreter"
    return "cpu"


def default_flags(device: str) -> dict[str, Any]:
    """Flags of the default mode: fallback allowed."""
    return {"auto_jit": 2, "device": device}


def compiled_flags(device: str) -> dict[str, Any]:
    """Flags of the compiled mode: every node must compile."""
    return {"auto_jit": 2, "device": device, "must_compile": True, "min_cluster_size": 1}


def missing_ops(model: onnx.ModelProto) -> list[str]:
    """Ops of the model's graph that are not in autoclust's op table (sorted, unique)."""
    from autoclust import ops
    return sorted({n.op_type for n in model.graph.node if ops.get(n.op_type, n.domain) is None})


def design_refusal(message: str) -> str | None:
    """For a NotCompilableError message: the first by-design refusal it lists, else None."""
    for line in message.splitlines()[1:]:
        reason = line.split(": ", 1)[-1].strip()
        if any(reason.startswith(d) for d in DESIGN_REFUSALS):
            return reason
    return None


# ---- running ----------------------------------------------------------------------------

def _short(exc: BaseException) -> str:
    """A one-line, stable reason: exception type and the informative part of its message."""
    text = str(exc).strip()
    if isinstance(exc, AssertionError):
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        keep = [ln for ln in lines if ln.startswith(("Mismatched", "Max abs", "Output",
                                                     "(shapes", "x:", "Not equal"))]
        text = "; ".join((keep or lines)[:2])
        return _clean("mismatch: " + text)
    return _clean(f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}")


def _clean(text: str) -> str:
    text = re.sub(r"\[ONNXRuntimeError\] : \d+ : ", "", text)
    text = re.sub(r"0x[0-9a-f]+", "0x…", text)        # addresses change from run to run
    text = re.sub(r"/\S+/", "", text)                  # so do absolute paths
    return text if len(text) <= 160 else text[:157] + "..."


def run_case(case: Any, prepare: Callable[[onnx.ModelProto], Any]) -> Outcome:
    """Run one node case through `prepare(model).run(inputs)`; None when it passes."""
    from onnx.backend.test.runner import Runner
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rep = prepare(case.model)
            for inputs, expected in case.data_sets:
                outs = rep.run([_array(x) for x in inputs])
                Runner.assert_similar_outputs([_array(x) for x in expected], list(outs),
                                              rtol=case.rtol, atol=case.atol)
    except Exception as exc:  # any failure is an outcome to record, not a crash
        return _short(exc)
    return None


def _array(x: Any) -> Any:
    return onnx.numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x


class OrtRep:
    """onnxruntime with default session options, fed like a BackendRep."""

    def __init__(self, model: onnx.ModelProto):
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.log_severity_level = 4
        self.session = ort.InferenceSession(model.SerializeToString(), so,
                                            providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.session.get_inputs()]

    def run(self, inputs: list[Any]) -> list[Any]:
        feeds = {n: (np.asarray(x) if isinstance(x, np.generic) else x)
                 for n, x in zip(self.names, inputs)}
        return self.session.run(None, feeds)


def ort_outcomes(cases: Any = None) -> dict[str, Outcome]:
    """Run onnxruntime itself on every case: name -> None (passed) or why it failed."""
    return {c.name: run_case(c, OrtRep) for c in (cases or node_cases())}


def our_outcome(case: Any, flags: dict[str, Any]) -> Outcome:
    """Run autoclust on one case with `flags`; None when it passes."""
    from autoclust.backend import AutoclustBackend
    return run_case(case, lambda m: AutoclustBackend.prepare(m, "CPU", **flags))


def compiled_outcome(case: Any, device: str) -> tuple[str, Outcome]:
    """("skip", why) for a case outside compiled mode, else ("run", outcome)."""
    missing = missing_ops(case.model)
    if missing:
        return "skip", f"ops not in the op table: {', '.join(missing)}"
    outcome = our_outcome(case, compiled_flags(device))
    if outcome and outcome.startswith("NotCompilableError"):
        why = design_refusal(outcome)
        if why:
            return "skip", why
    return "run", outcome


# ---- the results file -------------------------------------------------------------------

def versions() -> dict[str, str]:
    """The onnx and onnxruntime versions a results file is valid for."""
    import onnxruntime
    return {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}


def write_results(path: str, outcomes: dict[str, Outcome]) -> None:
    """Write the results file: versions, case count, and one line per failing case."""
    failures = {k: v for k, v in sorted(outcomes.items()) if v is not None}
    head = {**versions(), "cases": len(outcomes), "passed": len(outcomes) - len(failures)}
    lines = [json.dumps(k) + ": " + json.dumps(v) for k, v in failures.items()]
    text = json.dumps(head, indent=1)[:-2] + ',\n "failures": {\n  '
    text += ",\n  ".join(lines) + "\n }\n}\n"
    json.loads(text)  # the hand-made layout must still be JSON
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def read_results(path: str) -> dict[str, Any]:
    """The results file as a dict: onnx, onnxruntime, cases, passed, failures."""
    with open(path) as f:
        return json.load(f)


def default_results_path() -> str:
    """tests/data/ort_node_results.json of the source checkout (or of the current dir)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isfile(os.path.join(here, "pyproject.toml")):
        return os.path.join(here, RESULTS_FILE)
    return RESULTS_FILE


# ---- commands ---------------------------------------------------------------------------

def generate(path: str) -> int:
    """Run onnxruntime on every node case and write the results file."""
    start = time.perf_counter()
    outcomes = ort_outcomes()
    write_results(path, outcomes)
    failed = sum(v is not None for v in outcomes.values())
    print(f"{len(outcomes)} cases, onnxruntime fails {failed}; wrote {path} "
          f"({time.perf_counter() - start:.0f} s)")
    return 0


def summary(path: str, device: str, pattern: str | None, verbose: bool) -> int:
    """Run both modes over the cases and print the counts (and our failures)."""
    ort_fail = read_results(path)["failures"]
    cases = [c for c in node_cases() if not pattern or re.search(pattern, c.name)]
    start = time.perf_counter()
    tally: Counter[str] = Counter()
    ours: list[str] = []
    skipped: Counter[str] = Counter()
    for case in cases:
        ort_ok = case.name not in ort_fail
        tally["ort"] += ort_ok
        if ort_ok:
            out = our_outcome(case, default_flags(device))
            tally["default"] += out is None
            if out is not None:
                ours.append(f"default  {case.name}: {out}")
        kind, out = compiled_outcome(case, device)
        if kind == "skip":
            skipped[out.split(":")[0] if out.startswith("ops not") else _category(out)] += 1
            continue
        tally["compiled_cases"] += 1
        tally["compiled"] += out is None
        tally["wins"] += out is None and not ort_ok
        if out is not None and ort_ok:
            ours.append(f"compiled {case.name}: {out}")
    _print_summary(len(cases), tally, skipped, device, time.perf_counter() - start)
    if verbose or ours:
        print(f"\n{len(ours)} failure(s) of ours on cases onnxruntime passes:")
        print("\n".join("  " + line for line in ours))
    return 0


def _category(reason: str) -> str:
    for d in DESIGN_REFUSALS:
        if reason.startswith(d):
            return "refused: " + d.strip()
    return reason


def _print_summary(n: int, tally: Counter, skipped: Counter, device: str, secs: float) -> None:
    print(f"ONNX node cases (onnx {onnx.__version__}, device {device}): {n}")
    print(f"  onnxruntime passes:                 {tally['ort']}")
    print(f"  passed, default mode:               {tally['default']} / {tally['ort']}")
    print(f"  compiled-mode cases:                {tally['compiled_cases']}")
    print(f"  passed, compiled mode:              {tally['compiled']} / "
          f"{tally['compiled_cases']}")
    print(f"  compiled-only wins over onnxruntime: {tally['wins']}")
    print("  not compiled-mode cases:")
    for why, count in skipped.most_common():
        print(f"    {count:5d}  {why}")
    print(f"  ({secs:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    """Entry point: `generate` or `summary`."""
    p = argparse.ArgumentParser(prog="autoclust.tools.conformance", description=__doc__
                                .splitlines()[0])
    p.add_argument("command", choices=("generate", "summary"))
    p.add_argument("--results", default=None, help=f"results file (default: {RESULTS_FILE})")
    p.add_argument("--device", default=None, help=f"autoclust device (default: ${DEVICE_ENV}, "
                   "else cpu when usable, else interpreter)")
    p.add_argument("-k", dest="pattern", default=None, help="only cases matching this regex")
    p.add_argument("-v", dest="verbose", action="store_true")
    args = p.parse_args(argv)
    path = args.results or default_results_path()
    if args.command == "generate":
        return generate(path)
    return summary(path, args.device or default_device(), args.pattern, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
