"""One compile for a fleet: processes sharing --cache_dir build each entry once, never load
an entry built for another CPU, refuse a directory others can write and, under a key, an
entry that does not authenticate (reported, rebuilt). The cache is code: these tests are
its security."""

import json
import os
import pickle
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
from support import paths

import autoclust
from autoclust.runtime import disk_cache

REPO = paths.REPO
MODEL = os.path.join(REPO, "models", "mlp_gelu.onnx")
SCRIPT = """
import json, os, sys, time, warnings
warnings.simplefilter("always")
{patch}
import numpy as np, onnxruntime as ort
import autoclust
from autoclust import compile as compile_mod
from autoclust.backends.cpu import jit
from autoclust.runtime import disk_cache
sess = autoclust.InferenceSession({model!r}, cache_dir={cache!r}, threads=1)
if len(sys.argv) > 2:  # ready, then wait for everyone: all meet the new shape at once
    open(sys.argv[1], "w").close()
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.002)
x = np.random.default_rng(0).standard_normal(({rows}, 64)).astype(np.float32)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    y = sess.run(None, {{"x": x}})[0]
want = ort.InferenceSession({model!r}).run(None, {{"x": x}})[0]
print(json.dumps(dict(err=float(np.abs(y - want).max()), llvm=jit.COUNTS["compiles"],
                      lowered=compile_mod.COUNTS["lowered"], **disk_cache.COUNTS,
                      warnings=[str(w.message) for w in caught])))
"""
# the build of each object code takes a while longer: processes surely overlap
SLOW_COMPILE = """
from autoclust.backends.cpu import jit as _jit
_compile = _jit._compile
def _slow(*args):
    time.sleep(0.3)
    return _compile(*args)
_jit._compile = _slow
"""
# another CPU: code for LLVM's generic target, no features
OTHER_CPU = """
from llvmlite import binding as _llvm
class _NoFeatures(dict):
    def flatten(self):
        return ""
_llvm.get_host_cpu_name = lambda: "generic"
_llvm.get_host_cpu_features = lambda: _NoFeatures()
"""


def start(cache, rows=3, patch="", env=None, barrier=()):
    script = SCRIPT.format(patch=patch, model=MODEL, cache=str(cache), rows=rows)
    return subprocess.Popen([sys.executable, "-c", script, *map(str, barrier)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def result(proc):
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    row = json.loads(out.strip().splitlines()[-1])
    assert row["err"] < 1e-5, row
    return row


def run(cache, **kw):
    return result(start(cache, **kw))


def entries(cache):
    return sorted(p.name for p in cache.iterdir() if p.suffix in (".o", ".prog"))


def test_replicas_meeting_a_new_shape_build_each_entry_once(tmp_path):
    cache, n = tmp_path / "cache", 3
    ready = [tmp_path / f"ready{i}" for i in range(n)]
    go = tmp_path / "go"
    procs = [start(cache, patch=SLOW_COMPILE, barrier=(r, go)) for r in ready]
    deadline = time.monotonic() + 120
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    rows = [result(p) for p in procs]
    names = entries(cache)
    assert names and sum(n.endswith(".prog") for n in names) == 1
    assert sum(r["stored"] for r in rows) == len(names)  # each entry built by one process
    assert all(r["stored"] + r["loaded"] == len(names) for r in rows), rows  # the rest load
    assert sum(r["lowered"] for r in rows) == 1
    assert sum(r["lock_waits"] for r in rows) >= 1  # they did meet: the others waited
    warm = run(cache)
    assert (warm["stored"], warm["loaded"], warm["lowered"]) == (0, len(names), 0)
    # LLVM ran once per object entry in the whole fleet, plus what a warm process runs
    objects = sum(n.endswith(".o") for n in names)
    assert sum(r["llvm"] for r in rows) == objects + n * warm["llvm"]


def test_another_cpu_builds_its_own_code_and_shares_the_program(tmp_path):
    first = run(tmp_path)
    objects = [n for n in entries(tmp_path) if n.endswith(".o")]
    other = run(tmp_path, patch=OTHER_CPU)
    assert other["lowered"] == 0  # the kernel IR Program is target-neutral: loaded
    assert other["llvm"] >= len(objects) and other["stored"] == len(objects)
    assert other["loaded"] == 1  # the Program; no object code built for this host's CPU
    assert len([n for n in entries(tmp_path) if n.endswith(".o")]) == 2 * len(objects)
    again = run(tmp_path)
    assert again["stored"] == 0 and again["llvm"] <= first["llvm"] - len(objects)


def test_tampered_entry_is_refused_reported_and_rebuilt(tmp_path):
    env = {disk_cache.KEY_ENV: "fleet secret"}
    run(tmp_path, env=env)
    names = entries(tmp_path)
    assert all((tmp_path / n).read_bytes().startswith(disk_cache.MAC_MAGIC) for n in names)
    victim = tmp_path / next(n for n in names if n.endswith(".o"))
    data = bytearray(victim.read_bytes())
    data[-100] ^= 0x01  # one bit of the object code
    victim.write_bytes(bytes(data))
    row = run(tmp_path, env=env)
    assert row["refused"] == 1 and row["stored"] == 1 and row["loaded"] == len(names) - 1
    (message,) = [w for w in row["warnings"] if "refused" in w]
    assert victim.name in message and "does not verify" in message and "rebuilt" in message
    assert run(tmp_path, env=env)["refused"] == 0  # rewritten, authentic again


class _Payload:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_forged_program_entry_with_a_valid_checksum_never_unpickles(tmp_path):
    """An attacker who can write the directory but has no key: a pickle that would run
    code, stored with a correct sha256 (the unkeyed format) under the right name."""
    env = {disk_cache.KEY_ENV: "fleet secret"}
    run(tmp_path / "c", env=env)
    (prog,) = [n for n in entries(tmp_path / "c") if n.endswith(".prog")]
    blob = pickle.dumps(_Payload(str(tmp_path / "pwned")))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        disk_cache.store(str(tmp_path / "c"), prog[:-len(".prog")], blob, ".prog")  # no key
    row = run(tmp_path / "c", env=env)
    assert not (tmp_path / "pwned").exists()
    assert row["refused"] == 1 and row["lowered"] == 1
    assert any("not authenticated" in w for w in row["warnings"])
    # the same forgery where no key is set: the checksum passes and the pickle runs. Without
    # a key, the directory's permissions (the trust check) are all that protect a process.
    disk_cache.store(str(tmp_path / "c"), prog[:-len(".prog")], blob, ".prog")
    run(tmp_path / "c")
    assert (tmp_path / "pwned").is_dir()


@pytest.mark.parametrize("layout, words", [
    ({"cache": 0o777}, "is writable by other users (mode 777)"),
    ({"cache": 0o770}, "is writable by other users (mode 770)"),
    ({"cache": 0o1777}, "is writable by other users (mode 1777)"),  # sticky is no help here
    ({"up": 0o777, "cache": 0o700}, "up is writable by other users"),  # can rename it away
    ({"up": 0o1777, "cache": 0o700}, None),  # as /tmp: others cannot rename ours
    ({"cache": 0o755}, None),
])
def test_why_untrusted(tmp_path, layout, words):
    up = tmp_path / "up"
    cache = up / "cache"
    cache.mkdir(parents=True)
    up.chmod(layout.get("up", 0o755))
    cache.chmod(layout["cache"])
    reason = disk_cache.why_untrusted(str(cache))
    assert reason is None if words is None else words in reason


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="giving a directory to another user needs root")
def test_directory_of_another_user_is_untrusted(tmp_path):
    (tmp_path / "theirs").mkdir(mode=0o700)
    os.chown(tmp_path / "theirs", 4242, 4242)
    assert "belongs to uid 4242" in disk_cache.why_untrusted(str(tmp_path / "theirs"))
    assert "belongs to uid 4242" in disk_cache.why_untrusted(str(tmp_path / "theirs" / "new"))


def test_session_refuses_a_loose_directory_unless_trusted(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    x = np.ones((2, 64), np.float32)
    with pytest.warns(RuntimeWarning, match="refusing --cache_dir .*writable by other users"):
        y = autoclust.InferenceSession(MODEL, cache_dir=str(loose)).run(None, {"x": x})[0]
    assert list(loose.iterdir()) == []  # nothing written, nothing read
    trusted = autoclust.InferenceSession(MODEL, cache_dir=str(loose), cache_trusted=True)
    np.testing.assert_array_equal(trusted.run(None, {"x": x})[0], y)
    assert entries(loose)
