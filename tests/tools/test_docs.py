"""The README and docs/architecture.md say what the code does, and the test output reads."""

import os
import re
import shutil
import subprocess
import sys

import pytest
from autoclust.tools import cli
from support import paths

from autoclust import flags, registry

REPO = paths.REPO
README = os.path.join(REPO, "README.md")
ARCH = os.path.join(REPO, "docs", "architecture.md")


def addopts():
    """pyproject.toml's pytest addopts."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["pytest"]["ini_options"]["addopts"]


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def sample_after(text, intro):
    """The fenced block that follows the line `intro` in the README."""
    start = text.index(intro + "\n")
    found = re.compile(r"```\w*\n(.*?)```", re.DOTALL).search(text, start)
    return found.group(1)


def test_readme_links_the_architecture_page_in_the_repo():
    text = read(README)
    assert "../shared/ARCHITECTURE.md" not in text
    assert "](docs/architecture.md)" in text
    assert os.path.isfile(ARCH)


def _named_paths(text):
    return set(re.findall(r"`((?:autoclust|importers|backends|serve|tools|models|tests|docs)/"
                          r"[\w./-]*)`", text))


def test_every_path_the_map_names_exists():
    named = _named_paths(read(ARCH))
    assert len(named) > 30
    missing = sorted(p for p in named if not os.path.exists(os.path.join(REPO, p)))
    assert missing == [], f"docs/architecture.md names files that do not exist: {missing}"


def test_the_map_mentions_every_module():
    text = read(ARCH)
    unmentioned = []
    for top in ("autoclust", "importers", "backends", "serve", "tools", "models"):
        for root, dirs, files in os.walk(os.path.join(REPO, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            rel_dir = os.path.relpath(root, REPO) + "/"
            for name in files:
                if not name.endswith(".py") or name == "__init__.py":
                    continue
                if f"`{rel_dir}{name}`" in text or f"`{name}`" in text or f"`{rel_dir}`" in text:
                    continue
                unmentioned.append(rel_dir + name)
    assert unmentioned == [], ("add a line for each to docs/architecture.md's module table: "
                               f"{unmentioned}")


def test_readme_explain_sample_is_real_output(capsys):
    want = sample_after(read(README), "`autoclust explain models/mixed_dynamic.onnx` prints:")
    assert "Unclustered ops:" in want
    assert cli.main(["explain", os.path.join(REPO, "models", "mixed_dynamic.onnx")]) == 0
    assert capsys.readouterr().out == want


def _numbers_masked(text):
    return re.sub(r"\d+(\.\d+)?(e[-+]\d+)?", "N", text)


def test_readme_run_sample_is_real_output(capsys, monkeypatch):
    want = sample_after(read(README), "`autoclust run models/mlp_gelu.onnx --compare-ort` "
                                      "prints (times vary):")
    monkeypatch.chdir(REPO)
    code = cli.main(["run", "models/mlp_gelu.onnx", "--compare-ort"])
    got = capsys.readouterr().out
    assert code == 0
    assert _numbers_masked(got) == _numbers_masked(want)


def test_readme_links_every_docs_page_and_each_exists():
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", read(README)))
    pages = {"docs/" + n for n in os.listdir(os.path.join(REPO, "docs")) if n.endswith(".md")}
    assert linked == pages


def test_readme_tour_runs():
    """The tour's NumPy and builder lines, as written."""
    tour = read(README)[read(README).index("## A short tour"):]
    block = re.search(r"```python\n(fast = torch.*?)```", tour, re.DOTALL).group(1)
    code = "\n".join(ln for ln in block.splitlines() if not ln.startswith("fast ="))
    import numpy as np

    import autoclust
    env = {"np": np, "autoclust": autoclust}
    exec(code, env)  # noqa: S102 - the README's own lines
    x = np.array([-1.0, 0.5, 3.0], np.float32)
    assert np.allclose(env["relu2"](x), [0.0, 1.0, 6.0])
    want = 0.5 * x * (1 + np.tanh(0.79788456 * (x + 0.044715 * x ** 3)))
    assert np.allclose(env["gelu"](x), want, rtol=1e-5, atol=1e-6)


def test_readme_device_choices_match_the_flags():
    text = " ".join(read(os.path.join(REPO, "docs", "onnx.md")).split())
    found = re.search(r"`--device` \(([^;)]*)", text)
    named = [w.strip() for w in found.group(1).split(",")]
    assert named == list(registry.BACKENDS)  # the built-in --device choices
    spec = next(s for s in flags.SPECS if s.name == "device")
    assert set(named) <= set(spec.allowed())


def test_test_command_reports_no_skipped_lines():
    report = re.search(r"-r(\w+)", addopts()).group(1)
    assert "s" not in report and "a" not in report and "A" not in report
    assert {"f", "E", "x"} <= set(report)


TESTS = '''
import unittest
import pytest

@pytest.mark.parametrize("i", range(40))
def test_often_skipped(i):
    pytest.skip("onnxruntime fails: case %d" % i)

@pytest.mark.parametrize("i", range(3))
def test_rarely_skipped(i):
    pytest.skip("ops not in the op table: Foo")

@pytest.mark.xfail(reason="a known gap")
def test_known_gap():
    assert False

def test_broken():
    assert 1 == 2
'''

NODE_SUITE = '''
import unittest

class OnnxNodeDefault(unittest.TestCase):
    def test_abs_cpu(self):
        pass

class OnnxNodeCompiled(unittest.TestCase):
    def test_abs_cpu(self):
        pass
'''


def test_test_output_is_readable(tmp_path):
    """The project's pytest set-up on a run with many skips: a line per failure and xfail,
    skips counted by reason, the node-suite summary, nothing per skip."""
    (tmp_path / "pytest.ini").write_text(f"[pytest]\naddopts = {addopts()}\n")
    shutil.copy(os.path.join(REPO, "tests", "conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "data").mkdir()
    shutil.copy(os.path.join(REPO, "tests", "data", "ort_node_results.json"), tmp_path / "data")
    (tmp_path / "test_many.py").write_text(TESTS)
    (tmp_path / "test_onnx_backend.py").write_text(NODE_SUITE)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    out = proc.stdout
    assert proc.returncode == 1, out
    assert "SKIPPED" not in out
    assert "FAILED test_many.py::test_broken" in out
    assert "XFAIL test_many.py::test_known_gap - a known gap" in out
    assert re.search(r"43 skipped, by reason.*\n +40  onnxruntime fails\n +3  ops not in the "
                     r"op table\n", out), out
    assert "ONNX node suite (autoclust.onnx_backend)" in out
    assert "passed in default mode 1; passed compiled 1" in out
    lines = out.strip().splitlines()
    assert lines[-1].startswith("1 failed, 2 passed, 43 skipped, 1 xfailed")
    # the summaries sit right above the final line, after pytest's short summary
    assert lines.index(next(ln for ln in lines if "short test summary" in ln)) < \
        lines.index(next(ln for ln in lines if "skipped, by reason" in ln)) < \
        lines.index(next(ln for ln in lines if "ONNX node suite" in ln))
    assert len(lines) < 40


def test_tqdm_is_a_dependency():
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    assert any(d.startswith("tqdm") for d in deps)


def test_readme_test_command_is_what_ci_runs():
    with open(os.path.join(REPO, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read().strip().splitlines()[-1]
    setup = read(README)[read(README).index("## Set-up"):read(README).index("## A short tour")]
    commands = re.findall(r"```sh\n(.*?)\n```", setup, re.DOTALL)
    assert len(commands) == 2, "the README has exactly two set-up commands"
    assert commands[1] == ci
