"""Shared pytest set-up: tests/ on sys.path (for op_harness and zoo helpers)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
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
    terminalreporter.write_sep("=", "ONNX node suite (autoclust.backend)")
    terminalreporter.write_line(
        f"cases {results['cases']}; onnxruntime passes {results['passed']}; passed in "
        f"default mode {counts['OnnxNodeDefault']}; passed compiled "
        f"{counts['OnnxNodeCompiled']}; compiled-only wins over onnxruntime {wins}")
