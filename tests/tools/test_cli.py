"""The `autoclust` command line and the dump directory, driven as a user would."""

import argparse
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
from support import paths

import autoclust
from autoclust.runtime import interpreter

REPO = paths.REPO
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
    assert "Built 1 cluster covering 12/12 nodes" in out
    assert "max abs diff vs onnxruntime" in out
    # the interpreter interprets nodes: no "compiled", no "kernels"
    # 11 of them: GELU's final * 0.5 becomes the next MatMul's alpha
    assert "cluster_0000: interpreted, 11 nodes" in out
    assert "optimizing clusters for the interpreter" in out
    assert "compile" not in out and "kernel" not in out


def test_run_times_the_steady_state(capsys, monkeypatch):
    """`autoclust run` times nothing before measured placement has decided: its trial
    runs (both sides, repeated) read ConvNeXt at 0.34x onnxruntime over 20 timed runs."""
    from autoclust.tools import run as run_mod
    from autoclust.tools.bench import timing

    from autoclust.runtime import autotune
    seen = []
    real_settle, real_alternating = timing.settle, run_mod.alternating_ms

    def settle(sess, feeds, **kw):
        seen.append(("settle", autotune.measuring(sess._runtime)))
        runs = real_settle(sess, feeds, **kw)
        seen.append(("settled", autotune.measuring(sess._runtime), runs))
        return runs

    def alternating(sides, repeat):
        seen.append(("timed",))
        return real_alternating(sides, repeat)

    monkeypatch.setattr(timing, "settle", settle)
    monkeypatch.setattr(run_mod, "alternating_ms", alternating)
    code, out, _ = run_cli(["run", os.path.join(MODELS, "mlp_gelu.onnx"), "--repeat", "2",
                            "--compare-ort", "--flags=--min_cluster_size=1"], capsys)
    assert code == 0, out
    assert [s[0] for s in seen] == ["settle", "settled", "timed"]
    assert seen[0][1] is True and seen[1][1] is False  # a trial pending, then decided
    assert f"settled by run {1 + seen[1][2]}, median run" in out
    assert seen[1][2] >= 2  # the trial measured over several runs


def test_run_compiled_wording_and_plurals(capsys):
    code, out, _ = run_cli(["run", os.path.join(MODELS, "gelu.onnx"), "--repeat", "1"], capsys)
    assert code == 0, out
    assert "Built 1 cluster covering" in out and "1 clusters" not in out
    assert "cluster_0000: compiled once, 1 kernel\n" in out
    assert "(includes compiles)" in out


def test_plural():
    from autoclust.text import plural
    assert [plural(n, "kernel") for n in (0, 1, 2)] == ["0 kernels", "1 kernel", "2 kernels"]
    assert plural(1, "child", "children") == "1 child" and plural(3, "child", "children") \
        == "3 children"


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


MLP = os.path.join(MODELS, "mlp_gelu.onnx")
BERT = os.path.join(MODELS, "bert_encoder.onnx")


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    """Files a user might pass by mistake."""
    d = tmp_path_factory.mktemp("bad")
    (d / "text.txt").write_text("1 2 3\n")
    np.save(d / "objects.npy", np.array([1, "a", None], dtype=object), allow_pickle=True)
    np.savez(d / "two.npz", a=np.ones(2), b=np.ones(3))
    (d / "trunc.npz").write_bytes((d / "two.npz").read_bytes()[:100])
    (d / "garbage.onnx").write_bytes(b"\x00\x01 not a model")
    dump = d / "dump"
    dump.mkdir()
    (dump / "cluster_0000.onnx").write_bytes(onnx.load(MLP).SerializeToString())
    (dump / "cluster_0000.inputs.npz").write_bytes(b"PK\x03\x04 broken")
    (dump / "cluster_0001.onnx").write_bytes(b"\x08\x07 truncated")
    (dump / "cluster_0002.onnx").mkdir()  # not a dumped cluster: not listed
    return d


# (args, fragment of the one-line error); "{d}" is the bad_files folder.
MISTAKES = [
    (["run", "/no/such.onnx"], "no such model file: /no/such.onnx"),
    (["run", "{d}"], "is a directory, not an .onnx model file"),
    (["run", "{d}/garbage.onnx"], "cannot load"),
    (["run", MLP, "--flags=--bogus=1"], "unknown flag --bogus"),
    (["run", MLP, "--flags=--auto_jit=7"], "--auto_jit=7 is not one of: 0, 1, 2"),
    (["run", MLP, "--flags=--device=cpu '--log"], "cannot parse"),
    (["run", MLP, "--flags=device=cpu"], "flags look like --name=value"),
    (["run", MLP, "--dim", "oops"], "--dim takes NAME=VALUE"),
    (["run", BERT, "--dim", "seq=abc"], "--dim seq: the size must be an integer, got 'abc'"),
    (["run", BERT, "--dim", "seq=-3"], "--dim seq: the size must be >= 0"),
    (["run", BERT, "--dim", "seqq=64"], ("--dim seqq: the model has no symbolic dim 'seqq' (did "
                                        "you mean 'seq'?); its symbolic dims are: batch, seq")),
    (["run", os.path.join(MODELS, "gelu.onnx"), "--dim", "batch=2"],
     "no symbolic dim 'batch'; its symbolic dims are: n"),
    (["run", MLP, "--input", "x={d}/text.txt"], ("--input x: {d}/text.txt is not a .npy or .npz "
                                                "file")),
    (["run", MLP, "--input", "x={d}/objects.npy"], "Object arrays cannot be loaded"),
    (["run", MLP, "--input", "x={d}/two.npz"], "holds several arrays"),
    (["run", MLP, "--input", "{d}/two.npz"], ("--input a: the model has no input 'a'; its inputs "
                                             "are: x")),
    (["run", MLP, "--input", "{d}/trunc.npz"], "cannot read {d}/trunc.npz"),
    (["run", MLP, "--input", "x=/no/x.npy"], "--input x: no such file: /no/x.npy"),
    (["run", MLP, "--input", "y=/no/x.npy"], "--input y: no such file"),
    (["run", MLP, "--repeat", "many"], "argument --repeat: invalid int value: 'many'"),
    (["run"], "the following arguments are required: model"),
    (["nonsense"], "invalid choice: 'nonsense'"),
    (["explain", "/no/such.onnx"], "no such model file"),
    (["explain", MLP, "--html", "/no/such/dir/page.html"], ("No such file or directory: "
                                                           "/no/such/dir/page.html")),
    (["replay", "/no/cluster_0001"], "no dumped cluster model"),
    (["replay", "{d}/dump"], ("is a directory; replay one cluster of it, DIR/cluster_NNNN; "
                             "dumped clusters: cluster_0000, cluster_0001")),
    (["replay", "{d}/dump/cluster_0000"], "cannot read saved inputs"),
    (["replay", "{d}/dump/cluster_0001"], "cluster_0001.onnx': cannot load: DecodeError"),
    (["replay", "{d}/dump/cluster_0000", "--device", "tpu"], "argument --device: invalid choice"),
    (["exec", "/no/script.py"], "no such script: /no/script.py"),
    (["zoo", "nope", "--out", "{d}/zoo"], "unknown zoo model 'nope'"),
    (["bench", "--cases", "nope"], "unknown case(s) ['nope']"),
]


@pytest.mark.parametrize("args, fragment", MISTAKES, ids=[" ".join(a[:3])[-40:] for a, _ in
                                                          MISTAKES])
def test_user_mistakes_are_one_line_errors(args, fragment, bad_files, capsys):
    d = str(bad_files)
    args = [a.replace("{d}", d) for a in args]
    try:
        code = cli.main(args)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert fragment.replace("{d}", d) in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("autoclust")


def test_every_option_has_help():
    from autoclust.tools.bench import command as bench
    from autoclust.tools.fuzz import command as fuzz
    parsers = {"autoclust": cli.parser()}
    sub = next(a for a in parsers["autoclust"]._actions
               if isinstance(a, argparse._SubParsersAction))
    parsers.update(sub.choices)
    parsers["bench"] = bench.parser()
    parsers["fuzz"] = fuzz._parser()
    assert {"run", "explain", "replay", "flags", "exec", "zoo"} <= set(parsers)
    missing = [f"{name} {'/'.join(a.option_strings) or a.dest}"
               for name, p in parsers.items() for a in p._actions
               if not a.help and not isinstance(a, argparse._HelpAction)]
    assert missing == []


@pytest.mark.parametrize("command", ["run", "explain", "replay", "flags", "exec", "zoo"])
def test_help_of_each_command(command, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: autoclust {command}")


def test_explain_writes_html(tmp_path, capsys):
    page = tmp_path / "mixed.html"
    code, out, err = run_cli(["explain", os.path.join(MODELS, "mixed_dynamic.onnx"), "--html",
                              str(page)], capsys)
    assert code == 0 and out.startswith("Built 4 clusters") and f"wrote {page}" in err
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.count('class="cluster-box"') == 4
    assert 'id="legend"' in html and 'marker-end="url(#arrow)"' in html


def _closed_pipe():
    """A pipe whose read end is already closed: every write to it fails with EPIPE."""
    r, w = os.pipe()
    os.close(r)
    return w


@pytest.mark.parametrize("args", [["explain", BERT, "--json"], ["flags"]])
def test_output_into_a_closed_pipe_ends_quietly(args):
    w = _closed_pipe()
    try:
        proc = subprocess.run([sys.executable, "-m", "autoclust.tools.cli", *args], stdout=w,
                              stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    finally:
        os.close(w)
    assert proc.stderr == "" and proc.returncode == cli.SIGPIPE_STATUS


def test_output_cut_by_head_ends_quietly():
    cmd = f"{sys.executable} -m autoclust.tools.cli explain {BERT} --json | head -n 2"
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.stdout.splitlines()[0] == "{" and "Error" not in proc.stderr
    assert proc.returncode in (0, cli.SIGPIPE_STATUS)  # 0 when all fit in the pipe buffer


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
    assert text.endswith("\n") and not text.endswith("\n\n")
    dot = (dump / "clustering.dot").read_text()
    assert dot.count("subgraph ") == len(sess.plan.clusters)
    page = (dump / "clustering.html").read_text()
    assert "<svg" in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "data-dependent" in page and "cluster_0003" in page


def test_dumped_inputs_feed_onnxruntime_as_is(tmp_path):
    sess, dump = dump_session(tmp_path)
    for c in sess.plan.clusters:
        path = str(dump / f"{c.name}.inputs.npz")
        with np.load(path) as data:
            feeds = dict(data)
        assert list(feeds) == [v.name for v in c.inputs]
        ref = ort.InferenceSession(str(dump / f"{c.name}.onnx"),
                                   providers=["CPUExecutionProvider"])
        outs = ref.run(None, feeds)  # no renaming, no reordering: the file is the feed
        assert len(outs) == len(c.outputs)
        loaded = autoclust.report.dump.load_inputs(path)
        assert list(loaded) == list(feeds)
        assert all(np.array_equal(loaded[k], feeds[k]) for k in feeds)


def test_inputs_npz_takes_any_input_name(tmp_path):
    from autoclust.report.dump import load_inputs, save_inputs
    feeds = {"file": np.arange(3), "/enc/x:0": np.ones((2, 0), np.float16), "ü": np.bool_(1)}
    save_inputs(str(tmp_path / "x.inputs.npz"), feeds)
    back = load_inputs(str(tmp_path / "x.inputs.npz"))
    assert list(back) == list(feeds)
    for k, v in feeds.items():
        assert back[k].dtype == np.asarray(v).dtype and np.array_equal(back[k], v)


def test_replay_reads_the_old_inputs_layout(tmp_path, capsys):
    _, dump = dump_session(tmp_path)
    path = dump / "cluster_0000.inputs.npz"
    feeds = autoclust.report.dump.load_inputs(str(path))
    # the layout before names became keys: __names__ plus input_0, input_1, ...
    np.savez(path, __names__=np.array(list(feeds)),
             **{f"input_{i}": a for i, a in enumerate(feeds.values())})
    back = autoclust.report.dump.load_inputs(str(path))
    assert list(back) == list(feeds)
    assert all(np.array_equal(back[k], feeds[k]) for k in feeds)
    code, out, _ = run_cli(["replay", str(dump / "cluster_0000"), "--device", "interpreter"],
                           capsys)
    assert code == 0 and "saved inputs" in out, out


def test_run_feeds_a_dumped_npz(tmp_path, capsys):
    _, dump = dump_session(tmp_path)
    code, out, _ = run_cli(["run", str(dump / "cluster_0000.onnx"), "--input",
                            str(dump / "cluster_0000.inputs.npz"), "--repeat", "1",
                            "--flags=--device=interpreter", "--compare-ort"], capsys)
    assert code == 0, out
    assert "max abs diff vs onnxruntime" in out


def test_dump_names_are_sanitized(tmp_path):
    from autoclust.report.dump import Dumper, safe_name
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
    assert "interpreted " in out and " nodes)" in out and "kernel" not in out


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


def test_exec_mistakes_leave_this_process_alone(monkeypatch, capsys):
    """A missing script or bad flags must not install the hook or set AUTOCLUST_FLAGS here
    (it once did, and every later onnxruntime session in the process went through autoclust)."""
    monkeypatch.delenv("AUTOCLUST_FLAGS", raising=False)
    before = ort.InferenceSession
    assert cli.main(["exec", "/no/script.py"]) == 2
    monkeypatch.setenv("AUTOCLUST_FLAGS", "--bogus")
    assert cli.main(["exec", __file__]) == 2
    assert os.environ["AUTOCLUST_FLAGS"] == "--bogus"
    assert ort.InferenceSession is before
    assert "unknown flag --bogus" in capsys.readouterr().err


def test_exec_reports_the_scripts_own_error_as_python_would(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("import sys\nprint('started')\nraise ValueError('from the script')\n")
    cmd = [sys.executable, "-m", "autoclust.tools.cli", "exec", str(script)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=str(tmp_path),
                          timeout=120)
    assert proc.returncode == 1 and proc.stdout == "started\n"
    err = proc.stderr
    assert err.startswith("Traceback") and "ValueError: from the script" in err
    assert f'File "{script}", line 3' in err and "runpy" not in err
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=str(tmp_path),
                          timeout=120, env=dict(os.environ, AUTOCLUST_FLAGS="--bogus"))
    assert proc.returncode == 2 and proc.stderr.startswith("autoclust exec: error: unknown flag")


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
