"""The `autoclust` command line and the dump directory, driven as a user would."""

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from autoclust.models import zoo
from autoclust.tools import cli

import autoclust
from autoclust import interpreter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(REPO, "models")


def run_cli(args, capsys):
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_version_and_flags(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert autoclust.__version__ in capsys.readouterr().out
    code, out, _ = run_cli(["flags"], capsys)
    assert code == 0 and "--auto_jit" in out and "--min_cluster_size" in out


def test_run_bundled_model(capsys):
    code, out, _ = run_cli(["run", os.path.join(MODELS, "mlp_gelu.onnx"), "--repeat", "2",
                            "--compare-ort", "--flags=--device=interpreter"], capsys)
    assert code == 0, out
    assert "output logits: float32[2, 16]" in out
    assert "Built 1 clusters covering 12/12 nodes" in out
    assert "max abs diff vs onnxruntime" in out


def test_run_with_dims_and_inputs(tmp_path, capsys):
    x = np.ones((3, 64), np.float32)
    np.save(tmp_path / "x.npy", x)
    code, out, _ = run_cli(["run", os.path.join(MODELS, "mlp_gelu.onnx"), "--repeat", "1",
                            "--input", f"x={tmp_path / 'x.npy'}",
                            "--flags=--auto_jit=0"], capsys)
    assert code == 0 and "input  x: float32[3, 64]" in out
    code, out, _ = run_cli(["run", os.path.join(MODELS, "bert_encoder.onnx"), "--repeat", "1",
                            "--dim", "seq=8", "--flags=--auto_jit=0"], capsys)
    assert code == 0 and "input  input_ids: int64[2, 8]" in out


@pytest.mark.parametrize("args, fragment", [
    (["run", "/no/such.onnx"], "no such model file: /no/such.onnx"),
    (["run", os.path.join(MODELS, "mlp_gelu.onnx"), "--flags=--bogus=1"], "unknown flag --bogus"),
    (["run", os.path.join(MODELS, "mlp_gelu.onnx"), "--dim", "oops"], "--dim takes NAME=VALUE"),
    (["explain", "/no/such.onnx"], "no such model file"),
    (["replay", "/no/cluster_0001"], "no dumped cluster model"),
])
def test_user_mistakes_are_one_line_errors(args, fragment, capsys):
    code, _, err = run_cli(args, capsys)
    assert code == 2
    assert fragment in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_explain_text_and_json(capsys):
    path = os.path.join(MODELS, "mixed_dynamic.onnx")
    code, out, _ = run_cli(["explain", path, "--flags=--device=interpreter"], capsys)
    assert code == 0
    assert out.startswith("Built 4 clusters covering 24/27 nodes")
    assert "NonZero" in out and "data-dependent" in out
    code, out, _ = run_cli(["explain", path, "--json", "--flags=--device=interpreter"], capsys)
    data = json.loads(out)
    assert data["nodes"] == 27 and len(data["clusters"]) == 4
    assert {"id", "name", "nodes", "ops", "inputs", "outputs"} <= set(data["clusters"][0])
    assert {u["op"] for u in data["unclustered"]} == {"NonZero", "Unique", "TopK"}
    assert all(u["reason"] for u in data["unclustered"])


def dump_session(tmp_path, name="mixed_dynamic", **flags):
    model = zoo.build(name)
    feeds = zoo.feeds(model)
    dump = tmp_path / "dump"
    sess = autoclust.InferenceSession(model, device="interpreter", dump_to=str(dump),
                                      dump_inputs=True, **flags)
    sess.run(None, feeds)
    return sess, dump


def test_dump_directory(tmp_path):
    sess, dump = dump_session(tmp_path)
    files = set(os.listdir(dump))
    for f in ("manifest.json", "clustering.txt", "clustering.dot", "clustering.html"):
        assert f in files
    manifest = json.loads((dump / "manifest.json").read_text())
    for key in ("autoclust", "onnx", "onnxruntime", "llvmlite", "numpy"):
        assert key in manifest["versions"]
    assert manifest["flags"]["dump_to"] == str(dump)
    assert manifest["clusters"] == [c.name for c in sess.plan.clusters]
    for c in sess.plan.clusters:
        for suffix in (".onnx", ".before_optimizations.txt", ".after_optimizations.txt",
                       ".inputs.npz"):
            assert f"{c.name}{suffix}" in files
        model = onnx.load(str(dump / f"{c.name}.onnx"))
        onnx.checker.check_model(model)
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    text = (dump / "clustering.txt").read_text()
    assert "NonZero" in text and "data-dependent" in text
    dot = (dump / "clustering.dot").read_text()
    assert dot.count("subgraph ") == len(sess.plan.clusters)
    page = (dump / "clustering.html").read_text()
    assert "<svg" in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "data-dependent" in page and "cluster_0003" in page


def test_dump_names_are_sanitized(tmp_path):
    from autoclust.dump import Dumper, safe_name
    assert safe_name("../../etc/passwd") == "_.._etc_passwd"
    dumper = Dumper.create(str(tmp_path / "d"), autoclust.flags.parse(""))
    dumper.write("../escape.txt", "x")
    assert not (tmp_path / "escape.txt").exists()
    assert all(os.path.dirname(os.path.abspath(os.path.join(dumper.root, f))) == dumper.root
               for f in os.listdir(dumper.root))


def test_unwritable_dump_dir_warns_and_runs(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    model = zoo.build("gelu")
    with pytest.warns(RuntimeWarning, match="cannot write dumps"):
        sess = autoclust.InferenceSession(model, device="interpreter",
                                          dump_to=str(blocker / "sub"))
    feeds = zoo.feeds(model)
    assert sess.run(None, feeds)[0].shape == feeds["x"].shape


def test_replay_dumped_cluster(tmp_path, capsys):
    _, dump = dump_session(tmp_path)
    code, out, _ = run_cli(["replay", str(dump / "cluster_0000"), "--device", "interpreter"],
                           capsys)
    assert code == 0, out
    assert "saved inputs" in out and "MISMATCH" not in out and "max abs err" in out


def test_replay_reports_mismatch(tmp_path, capsys, monkeypatch):
    _, dump = dump_session(tmp_path)
    real = interpreter.Executable.run

    def wrong(self, inputs):
        return [o + 1 if o.dtype.kind == "f" else o for o in real(self, inputs)]
    calls = {"n": 0}

    def first_wrong(self, inputs):  # the compiled run is wrong, the reference run is not
        calls["n"] += 1
        return wrong(self, inputs) if calls["n"] <= 6 else real(self, inputs)
    monkeypatch.setattr(interpreter.Executable, "run", first_wrong)
    code, out, _ = run_cli(["replay", str(dump / "cluster_0000.onnx"), "--device",
                            "interpreter", "--repeat", "1"], capsys)
    assert code == 1 and "MISMATCH" in out


def test_replay_generates_inputs_without_npz(tmp_path, capsys):
    _, dump = dump_session(tmp_path)
    os.remove(dump / "cluster_0001.inputs.npz")
    code, out, _ = run_cli(["replay", str(dump / "cluster_0001"), "--device", "interpreter"],
                           capsys)
    assert code == 0 and "generated inputs" in out


def test_zoo_command_writes_every_model(tmp_path, capsys):
    code, _, _ = run_cli(["zoo", "--out", str(tmp_path)], capsys)
    assert code == 0
    assert sorted(p.stem for p in tmp_path.glob("*.onnx")) == sorted(zoo.BUILDERS)
    onnx.checker.check_model(onnx.load(str(tmp_path / "mlp_gelu.onnx")))


def test_console_script_entry_point(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "autoclust.tools.cli", "flags"], check=False,
                          capture_output=True, text=True, cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 0 and "--dump_to" in proc.stdout


def test_exec_runs_script_with_auto_jit(tmp_path):
    model = zoo.build("gelu")
    onnx.save(model, str(tmp_path / "g.onnx"))
    script = tmp_path / "s.py"
    script.write_text(
        "import sys, numpy as np, onnxruntime as ort\n"
        "s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
        "y = s.run(None, {'x': np.linspace(-3, 3, 1024).astype(np.float32)})[0]\n"
        "print(type(s).__mro__[1].__module__, hasattr(s, '_autoclust'), float(y.sum()))\n")
    env = dict(os.environ, AUTOCLUST_FLAGS="--device=interpreter")
    proc = subprocess.run([sys.executable, "-m", "autoclust.tools.cli", "exec", str(script),
                           str(tmp_path / "g.onnx")], check=False, capture_output=True, text=True,
                          cwd=str(tmp_path), env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "True" in proc.stdout.split()


def test_bench_command_writes_json_and_markdown(tmp_path, capsys):
    code, out, _ = run_cli(["bench", "--cases", "mixed_dynamic", "--repeat", "2",
                            "--threads", "1", "--out", str(tmp_path)], capsys)
    assert code == 0, out
    rows = json.loads((tmp_path / "bench.json").read_text())
    assert rows[0]["case"] == "mixed_dynamic" and rows[0]["ratio"] > 0
    assert rows[0]["max_abs_err"] < 1e-4 and rows[0]["clusters"] == 4
    assert "| mixed_dynamic |" in (tmp_path / "bench.md").read_text()
    code, _, err = run_cli(["bench", "--cases", "nope"], capsys)
    assert code == 2 and "unknown case" in err
