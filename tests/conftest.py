"""Shared pytest set-up: tests/ on sys.path (for op_harness and zoo helpers)."""

import atexit
import collections
import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))

# torch.compile(backend="autoclust") keeps compiled code under $XDG_CACHE_HOME by default
# (--torch_cache_dir): the tests get a directory of their own, never the developer's.
_XDG = tempfile.mkdtemp(prefix="autoclust-tests-xdg-")
os.environ["XDG_CACHE_HOME"] = _XDG
atexit.register(shutil.rmtree, _XDG, True)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After pytest's short summary (failures and xfails; pyproject's -r leaves skips out):
    the skips counted by reason, then the ONNX node-suite conformance summary, so both
    sit just above the final line."""
    result = yield
    _skip_summary(terminalreporter)
    _conformance_summary(terminalreporter)
    return result


def _skip_summary(terminalreporter):
    """One line per kind of skip (the reason up to its first colon), most frequent first."""
    counts = collections.Counter()
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ").split(":", 1)[0].strip()
        counts[reason[:70] or "no reason given"] += 1
    if not counts:
        return
    terminalreporter.write_sep("=", f"{sum(counts.values())} skipped, by reason (-rs lists them)")
    for reason, n in counts.most_common(8):
        terminalreporter.write_line(f"{n:6d}  {reason}")
    rest = sum(n for _, n in counts.most_common()[8:])
    if rest:
        terminalreporter.write_line(f"{rest:6d}  other reasons")


def _conformance_summary(terminalreporter):
    """After a run that included the ONNX node suite, print its conformance summary."""
    import json
    import re

    counts = {"OnnxNodeDefault": 0, "OnnxNodeCompiled": 0}
    compiled_passed: set[str] = set()
    for report in terminalreporter.stats.get("passed", []):
        m = re.search(r"test_onnx_backend\.py::(OnnxNode\w+)::(test_\w+)_cpu$", report.nodeid)
        if m and m.group(1) in counts and report.when == "call":
            counts[m.group(1)] += 1
            if m.group(1) == "OnnxNodeCompiled":
                compiled_passed.add(m.group(2))
    if not any(counts.values()):
        return
    path = os.path.join(os.path.dirname(__file__), "data", "ort_node_results.json")
    with open(path) as f:
        results = json.load(f)
    wins = len(compiled_passed & set(results["failures"]))
    terminalreporter.write_sep("=", "ONNX node suite (autoclust.onnx_backend)")
    terminalreporter.write_line(
        f"cases {results['cases']}; onnxruntime passes {results['passed']}; passed in "
        f"default mode {counts['OnnxNodeDefault']}; passed compiled "
        f"{counts['OnnxNodeCompiled']}; compiled-only wins over onnxruntime {wins}")
