"""Progress: a bar on a terminal for slow compiles, bench and fuzz; silence elsewhere
unless --log; nothing added to a warm run."""

import io
import sys
import time

from autoclust.models import zoo
from autoclust.tools.bench import command as bench
from autoclust.tools.fuzz import command as fuzz

import autoclust
from autoclust.report import progress
from autoclust.report.progress import Progress


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self):
        return True


def test_bar_on_a_terminal():
    out = Terminal()
    with Progress("work", total=2, unit="case", stream=out, delay=0) as bar:
        bar.start("first")
        bar.update()
        bar.write("a result line")
        bar.update()
    text = out.getvalue()
    assert "work: 100%" in text and "2/2 cases" in text and "a result line\n" in text


def test_no_bar_for_work_shorter_than_the_delay():
    out = Terminal()
    with Progress("work", total=3, stream=out, delay=30) as bar:
        bar.update(3)
    assert out.getvalue() == ""


def test_bar_shows_during_one_long_item():
    out = Terminal()
    bar = Progress("compiling", total=1, unit="cluster", stream=out, delay=0.05, leave=False)
    bar.start("cluster_0007")
    deadline = time.monotonic() + 10
    while "cluster_0007" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.02)  # no update() yet: the ticker thread draws the bar
    bar.update()
    bar.close()
    assert "compiling:   0%" in out.getvalue() and "cluster_0007" in out.getvalue()


def test_nothing_off_a_terminal_unless_log(monkeypatch):
    out = io.StringIO()
    with Progress("work", total=2, stream=out, delay=0) as bar:
        bar.update(2)
    assert out.getvalue() == ""
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    with Progress("work", total=2, unit="case", stream=out, log=True) as bar:
        bar.update()
        bar.update()
    lines = out.getvalue().splitlines()
    assert [ln.split(",")[0] for ln in lines] == ["work: 1/2 cases", "work: 2/2 cases",
                                                  "work: 2/2 cases"]
    assert all(ln.endswith(" s") for ln in lines)


def test_line_mode_is_throttled():
    out = io.StringIO()
    with Progress("work", total=100, unit="graph", stream=out, log=True) as bar:
        bar.update(100)  # within LINE_EVERY_S: only the closing line
    assert out.getvalue().startswith("work: 100/100 graphs, ") and out.getvalue().count("\n") == 1


def on_terminal(monkeypatch):
    """sys.stderr becomes a terminal (called in the test body: pytest's capture resets
    sys.stderr between fixture set-up and the test)."""
    tty = Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    return tty


def test_first_run_compiles_show_a_bar(monkeypatch):
    terminal = on_terminal(monkeypatch)
    monkeypatch.setattr(progress, "DELAY_S", 0.0)  # as if the compiles took over a second
    model = zoo.build("mixed_dynamic")
    sess = autoclust.InferenceSession(model, device="interpreter")
    sess.run(None, zoo.feeds(model))
    text = terminal.getvalue()
    # the bar counts the session's 4 clusters, then is removed (leave=False)
    assert "autoclust: optimizing for the interpreter:   0%" in text and "/4 clusters" in text
    assert text.endswith("\r")
    model = zoo.build("gelu")
    sess = autoclust.InferenceSession(model, device="cpu")
    sess.run(None, zoo.feeds(model))
    assert "autoclust: compiling:   0%|          | 0/1 clusters" in terminal.getvalue()


def test_quick_compiles_show_nothing(monkeypatch):
    terminal = on_terminal(monkeypatch)
    model = zoo.build("gelu")
    sess = autoclust.InferenceSession(model, device="interpreter")
    sess.run(None, zoo.feeds(model))
    assert terminal.getvalue() == ""


def test_compiles_off_a_terminal_print_only_with_log(capsys, monkeypatch):
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    model = zoo.build("mixed_dynamic")
    feeds = zoo.feeds(model)
    autoclust.InferenceSession(model, device="interpreter").run(None, feeds)
    assert capsys.readouterr().err == ""
    autoclust.InferenceSession(model, device="interpreter", log=True).run(None, feeds)
    err = capsys.readouterr().err.splitlines()
    assert len([ln for ln in err if "will be interpreted: " in ln]) == 4
    assert err[-1].startswith("autoclust: optimizing for the interpreter: 4/4 clusters, ")


def test_warm_runs_make_no_progress(monkeypatch):
    on_terminal(monkeypatch)
    made = []

    class Counting(Progress):
        def __init__(self, *args, **kwargs):
            made.append(args[0])
            super().__init__(*args, **kwargs)
    monkeypatch.setattr(progress, "Progress", Counting)
    model = zoo.build("mixed_dynamic")
    feeds = zoo.feeds(model)
    sess = autoclust.InferenceSession(model, device="interpreter")
    sess.run(None, feeds)
    assert made == ["autoclust: optimizing for the interpreter"]
    for _ in range(3):
        sess.run(None, feeds)
    assert len(made) == 1 and sess._runtime._progress is None


def fake_rows(monkeypatch):
    """bench cases that take no time (the bench itself is tested in test_cli)."""
    def run_one(case, args):
        return {"case": case, "ort_ms": 2.0, "autoclust_ms": 1.0, "ratio": 2.0,
                "compile_ms": 5.0, "kernels": [1], "max_abs_err": 0.0, "peak_rss_mb": 1.0}
    monkeypatch.setattr(bench, "_run_one", run_one)


def test_bench_progress(tmp_path, monkeypatch, capsys):
    terminal = on_terminal(monkeypatch)
    fake_rows(monkeypatch)
    args = ["--cases", "gelu,layernorm", "--out", str(tmp_path)]
    assert bench.main(args) == 0
    assert "autoclust bench: 100%" in terminal.getvalue() and "2/2 cases" in terminal.getvalue()
    assert capsys.readouterr().out.count("ratio   2.00x") == 2
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert bench.main(args) == 0 and sys.stderr.getvalue() == ""
    assert bench.main(args + ["--log"]) == 0
    assert sys.stderr.getvalue().startswith("autoclust bench: 2/2 cases, ")


def test_fuzz_progress(monkeypatch, capsys):
    terminal = on_terminal(monkeypatch)
    args = ["--cases", "3", "--device", "interpreter", "--in-process", "--features", "classic"]
    assert fuzz.main(args) == 0
    assert "autoclust fuzz: 100%" in terminal.getvalue() and "3/3 graphs" in terminal.getvalue()
    assert "0 failed" in terminal.getvalue()
    assert "graphs 3, mismatches 0" in capsys.readouterr().out
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert fuzz.main(args) == 0 and sys.stderr.getvalue() == ""
    assert fuzz.main(args + ["--log"]) == 0
    assert sys.stderr.getvalue().startswith("autoclust fuzz: 3/3 graphs, ")


def test_background_compiles_show_no_bar(monkeypatch):
    terminal = on_terminal(monkeypatch)
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    model = zoo.build("mixed_dynamic")
    sess = autoclust.InferenceSession(model, device="interpreter", async_compile=True)
    sess.run(None, zoo.feeds(model))  # onnxruntime runs the clusters meanwhile
    sess._runtime.wait_compiles()
    assert terminal.getvalue() == ""
    assert sum(r.compiles for r in sess._runtime.compiled_clusters()) == 4


def test_bisect_trials_show_a_bar_and_their_lines_above_it(monkeypatch, capsys):
    from autoclust.tools.debug import bisect
    terminal = on_terminal(monkeypatch)
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    trials = bisect.Trials({}, lambda model, feeds, flags, expected, interpreter: None, desc="autoclust bisect")
    for k in range(3):
        assert trials.run(None, {}) is None
        trials.log(f"  trial {k}: ok")
    trials.close()
    assert "autoclust bisect" in terminal.getvalue() and "3 trials" in terminal.getvalue()
    assert capsys.readouterr().out == "  trial 0: ok\n  trial 1: ok\n  trial 2: ok\n"
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # off a terminal: only the lines
    trials = bisect.Trials({}, lambda model, feeds, flags, expected, interpreter: None)
    trials.run(None, {})
    trials.close()
    assert sys.stderr.getvalue() == ""
