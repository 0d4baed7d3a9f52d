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
                   "dtype ", "Dropout ", "old opset form", "blocked quantization")

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


# Flags of the two modes (the device is prepare()'s device argument).
DEFAULT_FLAGS = {"auto_jit": 2}
COMPILED_FLAGS = {"auto_jit": 2, "must_compile": True, "min_cluster_size": 1}


def missing_ops(model: onnx.ModelProto) -> list[str]:
    """Ops of the model's graph that are not in autoclust's op table (sorted, unique)."""
    from autoclust import ops
    # Constant nodes never reach the op table: the importer turns them into initializers.
    return sorted({n.op_type for n in model.graph.node
                   if ops.get(n.op_type, n.domain) is None and n.op_type != "Constant"})


def design_refusal(message: str) -> str | None:
    """For a NotCompilableError message: the first by-design refusal it lists, else None."""
    from autoclust import ops
    never_lowered = {d.refuse for d in ops.all_ops() if d.refuse}  # OpDef.refuse reasons
    for part in message.split(": ", 1)[-1].split("; "):
        reason = part.split(": ", 1)[-1].strip()
        if any(reason.startswith(d) for d in DESIGN_REFUSALS) or reason in never_lowered:
            return reason
    return None


# ---- running ----------------------------------------------------------------------------

def describe(exc: BaseException) -> str:
    """A one-line, stable reason: exception type and the informative part of its message."""
    text = str(exc).strip()
    if isinstance(exc, AssertionError):
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        keep = [ln for ln in lines if ln.startswith(("Mismatched", "Max abs", "Output",
                                                     "(shapes", "x:", "Not equal"))]
        text = "; ".join((keep or lines)[:2])
        return _clean("mismatch: " + text)
    if type(exc).__name__ == "NotCompilableError":  # "N node(s) ...:\n  node: reason" lines
        lines = text.splitlines()
        return _clean("NotCompilableError: " + "; ".join(ln.strip() for ln in lines[1:] or lines))
    return _clean(f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}")


def _clean(text: str) -> str:
    text = re.sub(r"\[ONNXRuntimeError\] : \d+ : ", "", text)
    text = re.sub(r"^(\w+): \1 : ", r"\1: ", text, flags=re.IGNORECASE)  # Fail: FAIL : x
    text = _drop_cpp_locations(text)
    text = re.sub(r"0x[0-9a-f]+", "0x…", text)        # addresses change from run to run
    return text if len(text) <= 150 else text[:147] + "..."


def _drop_cpp_locations(text: str) -> str:
    """Drop onnxruntime's "/src/x.cc:12 Ns::F(args) " prefixes: they hide the message."""
    while (m := re.search(r"/\S+\.(?:cc|h|cpp):\d+ ", text)):
        depth, end = 0, m.end()
        for i in range(m.end(), len(text)):
            if text[i] == "(":
                depth += 1
            elif text[i] == ")":
                depth -= 1
                if depth == 0:
                    end = i + 1
                    break
        text = text[:m.start()] + text[end:].lstrip()
    return text


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
    except Exception as exc:  # noqa: BLE001 - any failure is an outcome to record
        return describe(exc)
    return None


def _array(x: Any) -> Any:
    return onnx.numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x


class OrtRep:
    """onnxruntime with default session options, fed like a BackendRep."""

    def __init__(self, model: onnx.ModelProto):
        import onnxruntime as ort
        from autoclust.backends.ort import ORIGINAL_SESSION
        so = ort.SessionOptions()
        so.log_severity_level = 4
        self.session = ORIGINAL_SESSION(model.SerializeToString(), so,
                                        providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.session.get_inputs()]

    def run(self, inputs: list[Any]) -> list[Any]:
        from autoclust.backends.ort import values
        feeds = {n: (np.asarray(x) if isinstance(x, np.generic) else x)
                 for n, x in zip(self.names, inputs)}
        if values.needs_ort_values(self.session):  # bfloat16, float8, int4, int2 as OrtValues
            return values.run(self.session, None, feeds)
        return self.session.run(None, feeds)


def ort_outcomes(cases: Any = None) -> dict[str, Outcome]:
    """Run onnxruntime itself on every case: name -> None (passed) or why it failed."""
    return {c.name: run_case(c, OrtRep) for c in (cases or node_cases())}


def our_outcome(case: Any, device: str, flags: dict[str, Any]) -> Outcome:
    """Run autoclust on one case on `device` with `flags`; None when it passes."""
    from autoclust.onnx_backend import AutoclustBackend
    return run_case(case, lambda m: AutoclustBackend.prepare(m, device, **flags))


def compiled_outcome(case: Any, device: str) -> tuple[str, Outcome]:
    """("skip", why) for a case outside compiled mode, else ("run", outcome)."""
    missing = missing_ops(case.model)
    if missing:
        return "skip", f"ops not in the op table: {', '.join(missing)}"
    outcome = our_outcome(case, device, COMPILED_FLAGS)
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


def case_outcomes(case: Any, device: str, ort_ok: bool) -> dict[str, Any]:
    """Both modes on one case: {"default": outcome | "n/a", "compiled": [kind, outcome]}."""
    default = our_outcome(case, device, DEFAULT_FLAGS) if ort_ok else "n/a"
    return {"default": default, "compiled": list(compiled_outcome(case, device))}


def _worker(path: str, device: str, names: list[str]) -> int:
    """Run `names` in this process, one JSON line per case (a crash loses only one case)."""
    import onnxruntime
    onnxruntime.set_default_logger_severity(3)  # fallback sub-sessions warn on old opsets
    ort_fail = read_results(path)["failures"]
    by_name = {c.name: c for c in node_cases()}
    for name in names:
        print(json.dumps({"start": name}), flush=True)
        result = case_outcomes(by_name[name], device, name not in ort_fail)
        print(json.dumps({"name": name, **result}), flush=True)
    return 0


def run_isolated(path: str, device: str, names: list[str]) -> dict[str, dict[str, Any]]:
    """case_outcomes for every name, in child processes; a crashing case is recorded as
    such (signal or exit status) and the rest continue in a fresh child."""
    import subprocess
    results: dict[str, dict[str, Any]] = {}
    todo = list(names)
    while todo:
        cmd = [sys.executable, "-m", "autoclust.tools.conformance", "_worker", "--results",
               path, "--device", device, "--names", ",".join(todo)]
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
        current = None
        for line in proc.stdout.splitlines():
            rec = json.loads(line) if line.startswith("{") else {}
            if "start" in rec:
                current = rec["start"]
            elif "name" in rec:
                results[rec["name"]] = rec
                current = None
        if current is None:
            if proc.returncode and todo[0] not in results:  # died before its first case
                raise RuntimeError(f"conformance worker failed: {proc.stderr.strip()[-2000:]}")
            break
        crash = f"crash: exit status {proc.returncode}; " + (proc.stderr.strip()
                                                                .splitlines() or [""])[-1]
        results[current] = {"default": _clean(crash), "compiled": ["run", _clean(crash)]}
        todo = todo[todo.index(current) + 1:]
    return results


def summary(path: str, device: str, pattern: str | None, verbose: bool) -> int:
    """Run both modes over the cases and print the counts (and our failures)."""
    ort_fail = read_results(path)["failures"]
    names = [c.name for c in node_cases() if not pattern or re.search(pattern, c.name)]
    start = time.perf_counter()
    results = run_isolated(path, device, names)
    tally: Counter[str] = Counter()
    ours: list[str] = []
    skipped: Counter[str] = Counter()
    for name in names:
        ort_ok = name not in ort_fail
        tally["ort"] += ort_ok
        res = results[name]
        if ort_ok:
            tally["default"] += res["default"] is None
            if res["default"] is not None:
                ours.append(f"default  {name}: {res['default']}")
        kind, out = res["compiled"]
        if kind == "skip":
            skipped[out.split(":")[0] if out.startswith("ops not") else _category(out)] += 1
            continue
        tally["compiled_cases"] += 1
        tally["compiled"] += out is None
        tally["wins"] += out is None and not ort_ok
        if out is not None:
            mode = "compiled" if ort_ok else "compiled (onnxruntime fails too)"
            ours.append(f"{mode} {name}: {out}")
    _print_summary(len(names), tally, skipped, device, time.perf_counter() - start)
    if verbose or ours:
        print(f"\n{len(ours)} failure(s) of ours:")
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
    p.add_argument("command", choices=("generate", "summary", "_worker"))
    p.add_argument("--names", default="", help=argparse.SUPPRESS)
    p.add_argument("--results", default=None, help=f"results file (default: {RESULTS_FILE})")
    p.add_argument("--device", default=None, help=f"autoclust device (default: ${DEVICE_ENV}, "
                   "else cpu when usable, else interpreter)")
    p.add_argument("-k", dest="pattern", default=None, help="only cases matching this regex")
    p.add_argument("-v", dest="verbose", action="store_true")
    args = p.parse_args(argv)
    path = args.results or default_results_path()
    if args.command == "generate":
        return generate(path)
    if args.command == "_worker":
        return _worker(path, args.device or default_device(), args.names.split(","))
    return summary(path, args.device or default_device(), args.pattern, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
