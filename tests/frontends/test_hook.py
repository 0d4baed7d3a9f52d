"""Auto-jit for an unmodified onnxruntime program, driven by AUTOCLUST_FLAGS.

The installed package puts autoclust-hook.pth in site-packages, an editable install too
(setup.py; its wheels are checked below). These tests process the repository's copy of the
.pth exactly as Python's start-up does (site.addsitedir) before running the plain
onnxruntime script, so they do not depend on how the package under test was installed.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile

import numpy as np
import onnx
import pytest
from autoclust.models import zoo
from support import paths

REPO = paths.REPO

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import onnxruntime as ort
    model, feeds_path, out_path = sys.argv[1:4]
    feeds = dict(np.load(feeds_path))
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    outs = sess.run(None, feeds)
    np.savez(out_path, *outs)
    print("session class:", type(sess).__module__, type(sess).__name__,
          isinstance(sess, ort.InferenceSession))
""")


def run_plain_script(tmp_path, env_flags):
    model = zoo.build("mlp_gelu")
    model_path = tmp_path / "m.onnx"
    onnx.save(model, str(model_path))
    feeds_path = tmp_path / "feeds.npz"
    np.savez(feeds_path, **zoo.feeds(model))
    script = tmp_path / "plain_ort.py"
    script.write_text(SCRIPT)
    site_dir = tmp_path / "site"
    site_dir.mkdir(exist_ok=True)
    with open(os.path.join(REPO, "autoclust-hook.pth")) as src:
        (site_dir / "autoclust-hook.pth").write_text(src.read())
    env = dict(os.environ)
    env.pop("AUTOCLUST_FLAGS", None)
    if env_flags is not None:
        env["AUTOCLUST_FLAGS"] = env_flags
    out_path = tmp_path / "out.npz"
    boot = (f"import site, sys, runpy; site.addsitedir({str(site_dir)!r}); "
            f"sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", boot, str(script), str(model_path),
                           str(feeds_path), str(out_path)], check=False, env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    with np.load(out_path) as data:
        outs = [data[k] for k in sorted(data.files, key=lambda s: int(s.split("_")[1]))]
    return outs, proc.stdout


def test_env_var_turns_on_auto_jit_and_dumps(tmp_path):
    dump = tmp_path / "dump"
    outs_jit, stdout = run_plain_script(tmp_path, f"--auto_jit=2 --dump_to={dump}")
    assert stdout.strip().endswith("True")  # still an onnxruntime.InferenceSession
    manifest = json.loads((dump / "manifest.json").read_text())
    assert manifest["clusters"], "the hook ran but formed no clusters"
    for name in manifest["clusters"]:
        assert (dump / f"{name}.onnx").exists()
        # the cluster ran: its compile left after-optimization text behind
        assert (dump / f"{name}.after_optimizations.txt").exists()
    outs_plain, _ = run_plain_script(tmp_path, None)
    for a, b in zip(outs_jit, outs_plain):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_without_env_var_nothing_changes(tmp_path):
    outs, stdout = run_plain_script(tmp_path, None)
    assert "onnxruntime" in stdout
    assert not (tmp_path / "dump").exists()
    assert len(outs) == 1


def test_auto_jit_zero_does_not_install(tmp_path):
    dump = tmp_path / "dump"
    run_plain_script(tmp_path, f"--auto_jit=0 --dump_to={dump}")
    assert not dump.exists()


@pytest.mark.speed
def test_startup_overhead_without_env_var(tmp_path):
    """The .pth line costs one environ lookup when AUTOCLUST_FLAGS is unset."""
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    with open(os.path.join(REPO, "autoclust-hook.pth")) as src:
        (site_dir / "autoclust-hook.pth").write_text(src.read())
    env = {k: v for k, v in os.environ.items() if k != "AUTOCLUST_FLAGS"}

    def start(code):
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], env=env, check=True)
            times.append(time.perf_counter() - t0)
        return float(np.median(times))
    with_hook = start(f"import site; site.addsitedir({str(site_dir)!r})")
    without = start("import site")
    print(f"start-up with hook {with_hook * 1e3:.1f} ms, without {without * 1e3:.1f} ms")
    probe = (f"import site, sys; site.addsitedir({str(site_dir)!r}); "
             "print([m for m in sys.modules if m.startswith('autoclust')])")
    loaded = subprocess.run([sys.executable, "-c", probe], check=True, env=env,
                            capture_output=True, text=True).stdout
    assert loaded.strip() == "[]"
    assert with_hook < without * 1.5 + 0.05


def run_hooked(tmp_path, code, env_flags, expect_rc=0):
    """Run `code` (a plain onnxruntime program; `model` is the path of mlp_gelu and `feeds`
    its inputs) with AUTOCLUST_FLAGS=env_flags and the hook's .pth processed."""
    model = zoo.build("mlp_gelu")
    onnx.save(model, str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "feeds.npz", **zoo.feeds(model))
    prelude = ("import numpy as np\nimport onnxruntime as ort\n"
               f"model = {str(tmp_path / 'm.onnx')!r}\n"
               f"feeds = dict(np.load({str(tmp_path / 'feeds.npz')!r}))\n")
    script = tmp_path / "prog.py"
    script.write_text(prelude + textwrap.dedent(code))
    site_dir = tmp_path / "site"
    site_dir.mkdir(exist_ok=True)
    with open(os.path.join(REPO, "autoclust-hook.pth")) as src:
        (site_dir / "autoclust-hook.pth").write_text(src.read())
    env = dict(os.environ, AUTOCLUST_FLAGS=env_flags)
    boot = (f"import site, runpy; site.addsitedir({str(site_dir)!r}); "
            f"runpy.run_path({str(script)!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", boot], check=False, env=env,
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == expect_rc, proc.stderr
    return proc


@pytest.mark.parametrize("env_flags, fragment", [
    ("--auto_jit=2 --bogus", "unknown flag --bogus"),
    ("--bogus", "unknown flag --bogus"),
    ("--auto_jit=2 --ops_to_cluster=ELEMENTWISE,Gelluu", "unknown op or group 'Gelluu'"),
    ("--cluster_exclude_ops=NOT_A_GROUP", "groups: CONV_EPILOGUE, DATA_DEPENDENT, ELEMENTWISE"),
    ("--disable_passes=cse,folding", "passes: fold_constants, fold_batchnorm, simplify, cse, patchify, siblings, dce, fuse_attention"),
])
def test_bad_flags_raise_flag_error_at_session_creation(tmp_path, env_flags, fragment):
    proc = run_hooked(tmp_path, """
        from autoclust.errors import FlagError
        try:
            ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        except FlagError as exc:
            print("FlagError:", exc)
        else:
            print("no error")
    """, env_flags)
    assert proc.stdout.startswith("FlagError:"), proc.stdout + proc.stderr
    assert fragment in proc.stdout


def test_flags_without_auto_jit_turn_it_on_with_one_warning(tmp_path):
    dump = tmp_path / "dump"
    proc = run_hooked(tmp_path, """
        for _ in range(2):
            sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
            sess.run(None, feeds)
        print("clusters:", len(sess._autoclust.plan.clusters))
    """, f"--dump_to={dump}")
    assert proc.stderr.count("does not set --auto_jit") == 1, proc.stderr
    assert "--auto_jit=2" in proc.stderr
    assert int(proc.stdout.split("clusters:")[1]) >= 1
    assert (dump / "manifest.json").exists()


def test_auto_jit_zero_with_other_flags_warns_they_do_nothing(tmp_path):
    dump = tmp_path / "dump"
    proc = run_hooked(tmp_path, """
        sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        print(hasattr(sess, "_autoclust"))
    """, f"--auto_jit=0 --dump_to={dump} --log")
    assert proc.stdout.strip() == "False"
    assert "sets --auto_jit=0, so autoclust is off and --dump_to, --log do nothing" in \
        proc.stderr
    assert not dump.exists()


def test_log_says_once_per_session_that_autoclust_is_active(tmp_path):
    proc = run_hooked(tmp_path, """
        for _ in range(2):
            sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
            for _ in range(3):
                sess.run(None, feeds)
    """, "--auto_jit=2 --log")
    lines = [ln for ln in proc.stderr.splitlines() if "autoclust: active" in ln]
    assert len(lines) == 2, proc.stderr
    assert "m.onnx (auto_jit=2, device=cpu): Built " in lines[0]
    assert " covering " in lines[0]


def test_onnxruntime_idioms_work_under_the_hook(tmp_path):
    proc = run_hooked(tmp_path, """
        from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument
        sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        print("isinstance", isinstance(sess, ort.InferenceSession))
        (name,) = feeds
        try:
            sess.run(None, {name: feeds[name].astype(np.float64)})
        except InvalidArgument as exc:
            print("caught:", exc)
        want = sess.run(None, feeds)[0]
        binding = sess.io_binding()
        binding.bind_cpu_input(name, feeds[name])
        binding.bind_output(sess.get_outputs()[0].name)
        sess.run_with_iobinding(binding)
        got = binding.copy_outputs_to_cpu()[0]
        values = sess.run_with_ort_values(None, {name: ort.OrtValue.ortvalue_from_numpy(
            feeds[name])})
        print("same", np.array_equal(got, want), np.array_equal(values[0].numpy(), want))
        print("runs", sorted({c["runs"] for c in sess._autoclust.stats()["clusters"]}))
    """, "--auto_jit=2")
    out = proc.stdout
    assert "isinstance True" in out
    assert "caught: input " in out and "expected dtype float32" in out
    assert "same True True" in out
    # every cluster ran 3 times: run, run_with_iobinding and run_with_ort_values
    assert "runs [3]" in out, out


def test_our_tools_compare_with_onnxruntime_itself_under_the_hook(tmp_path):
    """Under AUTOCLUST_FLAGS the hook swaps onnxruntime.InferenceSession for autoclust's;
    the benchmarks' and the fuzzer's baselines must stay onnxruntime's own (they compared
    autoclust with itself: `bench --profile` printed "onnxruntime's profile: 0 nodes")."""
    proc = run_hooked(tmp_path, """
        import onnx
        from autoclust.tools.bench import timing
        from autoclust.tools.fuzz import onnx_reference
        m = onnx.load(model)
        print("hooked", hasattr(ort.InferenceSession(model), "_autoclust"))
        print("bench", hasattr(timing.ort_session(m, 1), "_autoclust"))
        print("fuzz", hasattr(onnx_reference.ort_session(m), "_autoclust"))
    """, "--auto_jit=2")
    assert "hooked True" in proc.stdout, proc.stdout
    assert "bench False" in proc.stdout and "fuzz False" in proc.stdout, proc.stdout


@pytest.mark.parametrize("build", ["build_wheel", "build_editable"])
def test_regular_and_editable_wheels_put_the_hook_in_site_packages(tmp_path, build):
    """`pip install .` and `pip install -e .` both install autoclust-hook.pth at the top
    of site-packages (an editable wheel used to leave it out: AUTOCLUST_FLAGS then did
    nothing for a developer's plain onnxruntime program). Built from a copy of the
    sources with setuptools' PEP 517/660 hooks, as pip calls them."""
    pytest.importorskip("setuptools.command.editable_wheel")
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", "__pycache__", "*.egg-info", "build", "dist", ".*_cache", ".hypothesis",
        "bench_out", ".benchmarks"))
    out = tmp_path / "wheels"
    code = f"import sys; from setuptools import build_meta; print(build_meta.{build}(sys.argv[1]))"
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = out / proc.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        assert "autoclust-hook.pth" in names, names[:20]
        with open(os.path.join(REPO, "autoclust-hook.pth"), "rb") as f:
            assert zf.read("autoclust-hook.pth") == f.read()
        record = zf.read(next(n for n in names if n.endswith(".dist-info/RECORD")))
        assert b"autoclust-hook.pth," in record  # uninstalling removes it
    if build == "build_editable":  # processed after the finder that makes autoclust importable
        pths = sorted(n for n in names if n.endswith(".pth"))
        assert pths[-1] == "autoclust-hook.pth" and pths[0].startswith("__editable__"), pths
