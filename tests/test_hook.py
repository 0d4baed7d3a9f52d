"""Auto-jit for an unmodified onnxruntime program, driven by AUTOCLUST_FLAGS.

The installed package puts autoclust-hook.pth in site-packages. An editable (development)
install cannot, so these tests process the repository's copy of the .pth exactly as
Python's start-up does (site.addsitedir) before running the plain onnxruntime script.
"""

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import onnx
import pytest
from autoclust.models import zoo

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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
