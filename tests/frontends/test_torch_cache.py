"""torch.compile(backend="autoclust") keeps compiled code on disk by default, as inductor
does: a second process finds its kernels and lowered Programs compiled (importers/torch/
fx.py: --torch_cache_dir, "auto" = $XDG_CACHE_HOME/autoclust/torch). Each process here is a
fresh interpreter, so no in-process cache can answer for the disk."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install '.[torch]')")

from autoclust.importers.torch import fx as torch_fx

SCRIPT = r"""
import json, sys, torch
from torch import nn
from autoclust.runtime import disk_cache, program_cache
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8)).eval()
x = torch.randn(4, 16)
opts = json.loads(sys.argv[1])
with torch.no_grad():
    got = torch.compile(m, backend="autoclust", options=opts)(x)
    err = float((got - m(x)).abs().max())
print(json.dumps({"err": err, "program_hits": program_cache.COUNTS["program_hits"],
                  **disk_cache.COUNTS}))
"""


def _run(tmp_path, options: dict) -> dict:
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    env.pop("AUTOCLUST_FLAGS", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(options)], env=env,
                          capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_process_loads_what_the_first_compiled(tmp_path):
    first = _run(tmp_path, {})
    assert first["stored"] > 0 and first["loaded"] == 0 and first["program_hits"] == 0
    assert os.listdir(tmp_path / "xdg" / "autoclust" / "torch")
    second = _run(tmp_path, {})
    assert second["stored"] == 0 and second["loaded"] > 0 and second["program_hits"] > 0
    assert first["err"] < 1e-5 and second["err"] < 1e-5


def test_empty_setting_keeps_nothing(tmp_path):
    for _ in range(2):
        counts = _run(tmp_path, {"torch_cache_dir": ""})
        assert counts["stored"] == 0 and counts["loaded"] == 0
    assert not (tmp_path / "xdg" / "autoclust").exists()  # (onnxruntime keeps an id there)


def test_cache_dir_wins_over_the_default(tmp_path):
    counts = _run(tmp_path, {"cache_dir": str(tmp_path / "mine")})
    assert counts["stored"] > 0 and os.listdir(tmp_path / "mine")
    assert not (tmp_path / "xdg" / "autoclust").exists()  # (onnxruntime keeps an id there)


def test_where_auto_points(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert torch_fx.torch_cache_dir("auto") == str(tmp_path / "autoclust" / "torch")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert torch_fx.torch_cache_dir("auto") == str(tmp_path / "home" / ".cache" / "autoclust"
                                                   / "torch")
    assert torch_fx.torch_cache_dir("~/c") == str(tmp_path / "home" / "c")
