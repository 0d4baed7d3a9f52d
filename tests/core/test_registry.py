"""Backends by name: a third-party backend registered through the `autoclust.backends` entry
point becomes a --device choice everywhere, and the core drives it like a built-in one."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import onnxruntime as ort
import pytest
from autoclust.models import zoo

import autoclust
from autoclust import flags as flags_mod
from autoclust import registry
from autoclust.errors import FlagError

TOY = '''
"""A toy backend: renders through the CPU backend, counting what the core hands it."""
from autoclust.backends import cpu
from autoclust.registry import Policy

NAME = "toy"
POLICY = Policy()          # lowers kernel IR; leaves nothing to onnxruntime
PROGRAMS = []


def why_not(node, graph):
    return cpu.why_not(node, graph)


def compile(program, flags):
    PROGRAMS.append(program)
    return cpu.compile(program, flags)
'''


@pytest.fixture
def toy_backend(tmp_path, monkeypatch):
    """Install a `toy` backend module and a dist-info advertising its entry point."""
    (tmp_path / "toy_autoclust_backend.py").write_text(TOY)
    dist = tmp_path / "toy_autoclust_backend-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-autoclust-backend\n"
                                   "Version: 0.1\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent("""\
        [autoclust.backends]
        toy = toy_autoclust_backend
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    registry._loaded.pop("toy", None)
    sys.modules.pop("toy_autoclust_backend", None)


def test_entry_point_backend_is_a_device_choice_and_runs(toy_backend):
    assert "toy" in registry.device_names()
    assert flags_mod.parse("", device="toy").device == "toy"
    assert "toy" in flags_mod.table()
    model = zoo.build("layernorm")
    feeds = zoo.feeds(model)
    sess = autoclust.InferenceSession(model, device="toy", min_cluster_size=1)
    got = sess.run(None, feeds)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    toy = sys.modules["toy_autoclust_backend"]
    assert len(toy.PROGRAMS) == 1 and sess.stats()["clusters"][0]["compiles"] == 1


def test_unknown_device_lists_the_registered_ones(toy_backend):
    with pytest.raises(FlagError, match="cpu, gpu, interpreter, toy"):
        flags_mod.parse("", device="tpu")


def test_a_module_that_is_not_a_backend_is_refused(tmp_path, monkeypatch):
    (tmp_path / "not_a_backend.py").write_text("NAME = 'nab'\n")
    dist = tmp_path / "nab-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nab\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[autoclust.backends]\nnab = not_a_backend\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(FlagError, match="lacks"):
        registry.get_backend("nab")
