"""The measurement tools of issue 11: profile, zoo/micro tables, the exports benchmark.

Small committed zoo models run end to end (a few seconds); the real transformers exports
need torch/transformers/onnxscript and minutes, so that test is `speed` and skips without them.
"""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import onnx
import pytest
from autoclust.models import zoo
from autoclust.tools.bench import exports as bench_exports
from autoclust.tools.bench import profile as bench_profile
from autoclust.tools.bench import timing
from autoclust.tools.bench import zoo as bench_zoo

from autoclust import flags
from autoclust.kernel import ir as kir

MODELS = bench_zoo.MODELS_DIR


def _path(name: str) -> str:
    return os.path.join(MODELS, f"{name}.onnx")


@pytest.mark.parametrize("ops,want", [
    (["MatMul", "Add"], "gemm"),
    (["Mul", "Softmax", "Where"], "softmax"),
    (["ReduceMean", "Sub", "Pow", "Sqrt"], "reduce"),
    (["SkipLayerNormalization"], "norm"),
    (["Transpose", "Reshape"], "layout"),
    (["Transpose", "Add"], "elementwise"),
    (["FusedConv"], "conv"),
    ([], "elementwise"),
])
def test_category(ops, want):
    assert bench_profile.category(ops) == want


def _event(name, ts, dur, cat="Node", op="MatMul"):
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"op_name": op}}


def test_ort_profile_splits_runs_and_aggregates(tmp_path):
    events = [
        _event("init_kernel_time", 0, 500),  # before any run: session set-up, not counted
        _event("model_run", 1000, 100, cat="Session"),
        _event("mm_kernel_time", 1010, 40), _event("mm_fence_before", 1009, 1),
        _event("sm_kernel_time", 1060, 20, op="Softmax"),
        _event("model_run", 2000, 200, cat="Session"),
        _event("mm_kernel_time", 2010, 60), _event("sm_kernel_time", 2100, 30, op="Softmax"),
        _event("model_run", 3000, 90, cat="Session"),
        _event("mm_kernel_time", 3010, 50), _event("sm_kernel_time", 3070, 10, op="Softmax"),
    ]
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(events))
    p = bench_profile.ort_profile(str(path))
    assert p["runs"] == 3
    assert p["run_us"] == 100  # median of 100, 200, 90
    assert [(n["node"], n["op"], n["us"]) for n in p["nodes"]] == [
        ("mm", "MatMul", 50.0), ("sm", "Softmax", 20.0)]
    assert p["by_op"] == {"MatMul": 50.0, "Softmax": 20.0}
    assert p["kernels_us"] == 60  # median of the per-run sums 60, 90, 60


def test_profile_mlp_gelu_end_to_end():
    model = onnx.load(_path("mlp_gelu"))
    p = bench_profile.profile(_path("mlp_gelu"), zoo.feeds(model), threads=1, rounds=2,
                              block=3)
    assert p["max_abs_err"] < 1e-4
    assert [s["kind"] for s in p["steps"]] == ["cluster"]
    step = p["steps"][0]
    # every thunk of the executable is timed once per run: 5 thunks (3 generated GEMMs and
    # 2 fused kernels), which the uninstrumented executable runs in one native driver call
    assert step["thunks"] == len(p["thunks"]) == 5 and step["calls"] == 1
    kinds = sorted((t["kind"], t["category"]) for t in p["thunks"])
    # (GELU's final * 0.5 rides the next MatMul as its alpha: a FusedMatMul)
    assert kinds == [("generated FusedMatMul", "gemm"), ("generated Gemm", "gemm"),
                     ("generated MatMul", "gemm")] + [("kernel", "elementwise")] * 2
    assert all(t["us"] > 0 for t in p["thunks"])
    # the step contains its thunks, the run contains its steps
    assert sum(t["us"] for t in p["thunks"]) <= step["us"] <= p["runtime_us"]
    assert p["ort"]["runs"] == 2 * (1 + 3)
    assert {"Gemm", "FusedGemm", "Gelu"} <= set(p["ort"]["by_op"])
    cats = p["categories"]
    assert cats["gemm"][0] > 0 and cats["gemm"][1] > 0
    # the floor's run and GEMM time come from the same runs (each run holds its GEMMs, so
    # the rest is never negative; from separate rounds a noisy host read LLaMA's as -11.8 ms)
    fl = p["floor"]
    assert fl["autoclust"]["run_ms"] == pytest.approx(p["runtime_us"] / 1e3)
    assert fl["autoclust"]["rest_ms"] >= 0 and fl["onnxruntime"]["run_ms"] > 0
    text = bench_profile.markdown(p, top=3)
    assert "| 0 | cluster_0000 | cluster (5 thunks in 1 call) | 12 |" in text
    assert "slowest 3 of 5" in text


def test_a_loop_kernel_is_never_gemm_time():
    """A loop kernel naming a GEMM among its nodes (the epilogue of LLaMA's gate/up GEMM,
    RoPE's product inlined as a loop) is filed under its other ops; the calls are GEMMs.
    Filed under GEMM, such kernels put 1.75 ms of LLaMA-like's 20.8 in its GEMM time and
    its floor ratio read 1.05 for 1.15."""
    kernel = kir.Kernel("k0", (128, 1536), 0, (), (), ("mm_gate", "sig", "mul"))
    assert bench_profile._thunk_category(kernel, ["MatMul", "Sigmoid", "Mul"]) == "elementwise"
    assert bench_profile._thunk_category(kernel, ["MatMul", "Softmax"]) == "softmax"
    assert bench_profile._thunk_category(kernel, ["MatMul"]) == "elementwise"
    call = kir.LibraryCall("MatMul", (0, 1), (2,), ())
    assert bench_profile._thunk_category(call, ["MatMul", "Sigmoid"]) == "gemm"
    assert bench_profile._thunk_category(call, []) == "gemm"


def test_profile_counts_a_sibling_gemm_as_gemm(tmp_path):
    """The joined Q/K/V GEMM (a thunk named after its sibling group, a node the graph does
    not hold) is a GEMM in the categories and the floor ratio, not "elementwise" (it was:
    BERT-base's floor ratio read 1.50 instead of 1.10)."""
    model = zoo.build("bert_encoder", hidden=256, heads=4, layers=1, inter=1024)
    path = tmp_path / "bert.onnx"
    onnx.save(model, str(path))
    p = bench_profile.profile(str(path), zoo.feeds(model, {"batch": 1, "seq": 64}), threads=1,
                              rounds=1, block=2, flags="--autotune=false")
    joined = [t for t in p["thunks"] if any(n.startswith("siblings") for n in t["nodes"])]
    assert joined and all(t["category"] == "gemm" for t in joined), joined
    assert all(set(t["ops"]) <= {"Gemm", "MatMul"} for t in joined), joined


def test_profile_shows_onnxruntime_segments():
    path = _path("mixed_dynamic")
    p = bench_profile.profile(path, zoo.feeds(onnx.load(path)), threads=1, rounds=1, block=2)
    kinds = [s["kind"] for s in p["steps"]]
    assert "onnxruntime segment" in kinds and "cluster" in kinds
    seg_ops = {op for s in p["steps"] if s["kind"] != "cluster" for op in s["ops"]}
    assert {"NonZero", "Unique", "TopK"} <= seg_ops
    seg = p["categories"]
    assert seg[bench_profile.SEGMENT_REST][0] > 0 and seg[bench_profile.SEGMENT_GEMM][0] == 0
    assert p["max_abs_err"] == 0 or p["max_abs_err"] < 1e-4


def test_zoo_models_main_job_first():
    names = [os.path.basename(p)[:-5] for p in bench_zoo.zoo_models()]
    assert names[0] == "mlp_gelu"
    assert sorted(names) == sorted(f[:-5] for f in os.listdir(MODELS) if f.endswith(".onnx"))


def test_zoo_row_and_table():
    row = bench_zoo.zoo_row(_path("mlp_gelu"), threads=1, rounds=2, block=2)
    assert row["model"] == "mlp_gelu"
    assert row["feeds"] == "x[2, 64]"  # the committed dims (batch=2)
    assert row["kernels"] == 5 and row["clusters"] == 1 and row["segments"] == 0
    assert row["max_abs_err"] < 1e-4
    assert row["ratio"] == pytest.approx(row["ort_ms"] / row["autoclust_ms"])
    assert row["ratio_p25"] <= row["ratio_p75"]
    text = bench_zoo.zoo_markdown([row, dict(row, model="other", ratio=2.0)])
    lines = text.splitlines()
    assert lines[2].startswith("| mlp_gelu | x[2, 64] |")
    assert lines[3].endswith("| met |")
    assert lines[4].startswith("| geomean |")


def test_micro_gelu_row_times_a_copy(monkeypatch):
    from autoclust.tools.bench import command as bench
    # the real case at 1/64 of its size: the same code path, a fraction of the time
    monkeypatch.setitem(bench.CASES, "gelu", ("gelu", {}, {"n": 1 << 18}, 1 << 20))
    row = bench_zoo.micro_row("gelu", threads=1, rounds=2, block=2)
    assert row["copy_ms"] > 0 and row["kernels"] == 1 and row["max_abs_err"] < 1e-5
    assert "erf-GELU" in bench_zoo.micro_markdown([row])


@pytest.mark.parametrize("case,fields,verdict", [
    ("gelu", {"autoclust_ms": 11.0, "copy_ms": 10.0}, "met"),      # 1.1x of a copy
    ("gelu", {"autoclust_ms": 13.0, "copy_ms": 10.0}, "missed"),   # 1.3x
    ("chain16", {"ratio": 10.5}, "met"),
    ("softmax_mask", {"ratio": 1.9}, "missed"),
])
def test_micro_verdicts(case, fields, verdict):
    row = {"case": case, "title": case, "ort_ms": 10.0, "autoclust_ms": 5.0, "ratio": 2.0,
           "ratio_p25": 1.0, "ratio_p75": 3.0, **fields}
    line = bench_zoo.micro_markdown([row]).splitlines()[2]
    assert line.endswith(f"| {verdict} |")


def test_alternate_and_spread():
    calls = []
    times = timing.alternate({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                             rounds=2, block=3)
    assert calls == ["a"] * 4 + ["b"] * 4 + ["a"] * 4 + ["b"] * 4  # untimed + 3, alternating
    assert len(times["a"]) == len(times["b"]) == 6
    fake = {"x": [2.0, 2.0, 4.0, 4.0], "y": [1.0, 1.0, 1.0, 1.0]}
    assert timing.ratio_spread(fake, "x", "y", 2) == (2.5, 3.5)
    # the headline ratio: each round's (one load state), the median over rounds; the load
    # tripled the last round on both sides, which a ratio of all-round medians mixes in
    drift = {"x": [1.0, 2.0, 6.0, 8.0, 30.0, 30.0], "y": [1.0, 1.0, 2.0, 2.0, 10.0, 10.0]}
    assert timing.round_ratios(drift, "x", "y", 2) == [1.5, 3.5, 3.0]
    assert timing.round_ratio(drift, "x", "y", 2) == 3.0
    assert np.median(drift["x"]) / np.median(drift["y"]) == 3.5
    assert np.isnan(timing.round_ratio({"x": [], "y": []}, "x", "y", 2))


def test_cli_dispatches_zoo_table(tmp_path, capsys):
    from autoclust.tools import cli
    rc = cli.main(["bench", "--zoo", "--models", "layernorm", "--rounds", "1", "--block", "1",
                   "--threads", "1", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| layernorm |" in out
    rows = json.loads((tmp_path / "zoo.json").read_text())["rows"]
    assert rows[0]["model"] == "layernorm" and rows[0]["ratio"] > 0


def test_exports_markdown_and_install_hint(monkeypatch):
    floor = {"autoclust": {"floor_ratio": 1.08, "gemm_ms": 18.5},
             "onnxruntime": {"floor_ratio": 1.2, "gemm_ms": 25.0}}
    row = {"model": "gpt2", "title": "GPT-2", "ort_ms": 30.0, "autoclust_ms": 20.0,
           "ratio": 1.5, "ratio_p25": 1.4, "ratio_p75": 1.6, "session_ms": 300.0,
           "first_run_ms": 2500.0, "new_seq_ms": 120.0, "new_seq": 48, "settle_runs": 9,
           "cached_session_ms": 200.0, "cached_first_run_ms": 90.0, "max_abs_err": 1e-6,
           "clusters": 1, "segments": 0, "kernels": 56, "openvino_ms": 25.0,
           "openvino_ratio": 1.2, "openvino_err": 2e-6, "floor": floor,
           "placement": [{"winner": "compiled"}]}
    image = dict(row, model="vit", title="ViT", ratio=6.0, placement=[])
    del image["new_seq_ms"]
    held = dict(row, model="t5", title="T5", ratio=0.5, ratio_runs=[0.4, 0.5, 0.7],
                placement=[{"winner": "compiled"}, {"winner": "onnxruntime"}])
    text = bench_exports.markdown([row, image, held])
    tuned, rest = text.split("Held out")
    assert "| GPT-2 | 30.00 | 20.00 | **1.50x** | 1.40-1.60 (p25-p75) | 25.00 | 1.20x | " \
           "1.08 / 1.20 | 18.5 / 25.0 | compiled | 1.0e-06 / 2.0e-06 | 1 / 0 / 56 |" in tuned
    assert "| geomean |  |  | **3.00x** |  |  | 1.20x |" in tuned and "T5" not in tuned
    assert "| T5 | 30.00 | 20.00 | **0.50x** | 0.40-0.70 (3 runs) |" in rest
    assert "| 1 compiled, 1 onnxruntime |" in rest and "none measured" in tuned
    assert "| GPT-2 | 0.30 | 2.50 | 9 | 0.12 (seq 48) | 0.20 | 0.09 |  |" in rest
    assert "| ViT | 0.30 | 2.50 | 9 | n/a | 0.20 | 0.09 |  |" in rest
    real_import = __import__

    def no_torch(name, *args, **kwargs):
        if name == "torch":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr("builtins.__import__", no_torch)
    with pytest.raises(SystemExit, match=r"needs torch.*pip install \"autoclust\[bench\]\""):
        bench_exports.require()


def test_exports_sweep_models_and_inputs():
    """`--models sweep` names sweep.py's 28 architectures, all outside the default ten and
    reported in a table of their own; each input descriptor makes seed-0 feeds."""
    assert bench_exports.model_names("") == bench_exports.DEFAULT
    assert len(bench_exports.DEFAULT) == 10
    swept = bench_exports.model_names("sweep")
    assert len(swept) == 28 and not set(swept) & set(bench_exports.DEFAULT)
    assert all(bench_exports.SPECS[n].sweep and bench_exports.SPECS[n].held_out for n in swept)
    assert bench_exports.model_names("sweep:bloom,opt") == ["bloom", "opt"]

    class Cfg:
        vocab_size = 50

    feeds = {n: bench_exports.SPECS[n].inputs(Cfg()) for n in ("bart", "mobilevit",
                                                              "wav2vec2", "falcon")}
    assert {k: v.shape for k, v in feeds["bart"].items()} == {
        "input_ids": (1, 64), "decoder_input_ids": (1, 64)}
    assert feeds["mobilevit"]["pixel_values"].shape == (1, 3, 256, 256)
    assert feeds["wav2vec2"]["input_values"].shape == (1, 16000)
    assert list(feeds["falcon"]) == ["input_ids"]  # no mask: the decoders' causal one
    assert bench_exports.SPECS["falcon"].extra == (("use_cache", False),)
    again = bench_exports.SPECS["mobilevit"].inputs(Cfg())["pixel_values"]
    np.testing.assert_array_equal(again, feeds["mobilevit"]["pixel_values"])
    row = {"model": "bloom", "title": "BLOOM-like", "ort_ms": 5.0, "autoclust_ms": 4.0,
           "ratio": 1.25, "session_ms": 100.0, "first_run_ms": 500.0, "max_abs_err": 1e-6,
           "clusters": 1, "kernels": 9}
    text = bench_exports.markdown([row])
    assert "Architecture sweep" in text and "Held out" not in text
    assert "| BLOOM-like | 5.00 | 4.00 | **1.25x** |" in text


def test_new_seq_feeds():
    feeds = {"input_ids": np.arange(8).reshape(1, 8), "attention_mask": np.ones((1, 8))}
    alt = bench_exports.new_seq_feeds(feeds)
    assert {k: v.shape for k, v in alt.items()} == {"input_ids": (1, 6), "attention_mask": (1, 6)}
    assert alt["input_ids"].tolist() == [[0, 1, 2, 3, 4, 5]]
    assert bench_exports.new_seq_feeds({"pixel_values": np.zeros((1, 3, 4, 4))}) is None


HAVE_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "transformers", "onnxscript"))


@pytest.mark.skipif(not HAVE_TORCH, reason="needs the bench extra (torch, transformers, "
                                           "onnxscript)")
def test_export_tiny_gpt2_end_to_end(tmp_path, monkeypatch):
    from transformers import GPT2Config, GPT2Model

    def tiny():
        cfg = GPT2Config(n_layer=1, n_embd=64, n_head=2, vocab_size=100, n_positions=64)
        return cfg, GPT2Model(cfg)

    spec = bench_exports.Spec("tiny GPT-2", tiny, bench_exports._ids(16), "ids [1,16]",
                              (("use_cache", False),))
    monkeypatch.setitem(bench_exports.SPECS, "tiny", spec)
    logs = []
    path, feeds = bench_exports.export("tiny", str(tmp_path), logs.append)
    assert len(logs) == 1 and os.path.exists(path)
    assert bench_exports.export("tiny", str(tmp_path), logs.append) == (path, feeds)
    assert len(logs) == 1  # the second call found the cached export
    dims = onnx.load(path).graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_value == 1 and dims[1].dim_param  # the sequence length is symbolic
    cache = tmp_path / "compiled"
    row = bench_exports.run_one("tiny", path, feeds, threads=1, rounds=1, block=1,
                                torch_sides=["eager"], flags=f"--cache_dir={cache}")
    assert row["max_abs_err"] < 1e-4 and row["eager_err"] < 1e-4
    assert row["ratio"] > 0 and row["eager_ms"] > 0 and row["clusters"] >= 1
    assert row["new_seq"] == 12 and row["new_seq_err"] < 1e-4 and row["new_seq_ms"] > 0
    assert any(cache.iterdir())  # the first session filled --cache_dir
    warm = bench_exports.cached_run(path, feeds, threads=1, flags=f"--cache_dir={cache}")
    assert warm["cached_first_run_ms"] > 0
    with np.load(feeds) as z:
        assert z["input_ids"].shape == (1, 16)


def test_profile_pass_through_model():
    # resnet_block leaves Conv/BN/Relu/Add to onnxruntime: nothing clusters, the session
    # hands the whole model to one onnxruntime session, and the profile says so
    path = _path("resnet_block")
    p = bench_profile.profile(path, zoo.feeds(onnx.load(path)), threads=1, rounds=1, block=2)
    assert [s["kind"] for s in p["steps"]] == ["onnxruntime pass-through"]
    assert p["thunks"] == []
    ours = {c: a for c, (a, _) in p["categories"].items() if a}
    assert list(ours) == ["onnxruntime pass-through (nothing clustered)"]
    assert p["categories"]["conv"][1] > 0  # onnxruntime's own profile still splits it
    assert p["max_abs_err"] == 0


def test_exports_combine_takes_the_median_process():
    rows = [{"model": "gpt2", "ratio": r, "openvino_ratio": r + 0.1, "k": i}
            for i, r in enumerate([1.1, 0.9, 1.0])]
    out = bench_exports.combine(rows + [{"model": "gpt2", "error": "boom"}])
    assert out["k"] == 2 and out["ratio_runs"] == [0.9, 1.0, 1.1]
    assert out["openvino_ratio_runs"] == pytest.approx([1.0, 1.1, 1.2])


def test_segment_time_split_by_onnxruntime_profile():
    """A segment's time is split by its nodes' shares in onnxruntime's profile of the whole
    model (fused names keep the node's name before the slash); the GEMM/Conv part counts in
    our floor. Unsplit, Whisper's convolutions in onnxruntime read as our non-GEMM time."""
    rec = bench_profile.Recorder()
    rec.samples[("step", 0)] = [4e-3, 4e-3, 5e-3]
    rec.samples[("step", 1)] = [9e-3, 9e-3, 9e-3]
    steps = [{"key": ("step", 0), "kind": "onnxruntime segment", "nodes": ["conv", "gelu"]},
             {"key": ("step", 1), "kind": "cluster", "nodes": ["mm"]}]
    prof = {"nodes": [{"node": "conv/ConvActivationFusion", "us": 300.0, "category": "conv"},
                      {"node": "gelu", "us": 100.0, "category": "elementwise"},
                      {"node": "mm", "us": 900.0, "category": "gemm"}]}
    ours = {"gemm": 9000.0, "onnxruntime segments": 4000.0}
    bench_profile._split_segments(ours, steps, rec, prof)
    assert ours[bench_profile.SEGMENT_GEMM] == pytest.approx(3000.0)
    assert ours[bench_profile.SEGMENT_REST] == pytest.approx(1000.0)
    assert "onnxruntime segments" not in ours
    cats = {c: (us, 0.0) for c, us in ours.items()}
    assert bench_profile.floor(13.0, 13.0, cats)["autoclust"]["gemm_ms"] == pytest.approx(12.0)


def test_floor_ratio_from_categories():
    # us per run: (autoclust, onnxruntime); convolutions count as GEMM work
    cats = {"gemm": (8000.0, 9000.0), "conv": (1000.0, 0.0), "norm": (500.0, 900.0)}
    fl = bench_profile.floor(10.0, 12.0, cats)
    assert fl["autoclust"]["gemm_ms"] == pytest.approx(9.0)
    assert fl["autoclust"]["floor_ratio"] == pytest.approx(10.0 / 9.0)
    assert fl["onnxruntime"]["rest_ms"] == pytest.approx(3.0)
    assert "| onnxruntime | 12.000 | 9.000 | 3.000 | 1.33 |" in bench_profile.floor_table(fl)


def test_ab_times_both_flag_settings_in_one_process(tmp_path, capsys, monkeypatch):
    """Four sessions made A, B, B, A; each side's median over its rounds; a / b their
    ratio. The sessions really carry their side's flags."""
    from autoclust.tools.bench import ab
    model = onnx.load(_path("mlp_gelu"))
    made: list[str] = []
    real = timing.autoclust_session

    def session(m, threads, flags=""):
        made.append(flags)
        return real(m, threads, flags)

    monkeypatch.setattr(timing, "autoclust_session", session)
    r = ab.ab(_path("mlp_gelu"), zoo.feeds(model), "--cpu_helpers=python", "", rounds=2,
              block=2, threads=2)
    assert made == ["--cpu_helpers=python", "", "", "--cpu_helpers=python"]
    assert r["a_ms"] > 0 and r["b_ms"] > 0
    assert r["a_over_b"] == pytest.approx(r["a_ms"] / r["b_ms"])
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, **zoo.feeds(model))
    assert ab.main([_path("mlp_gelu"), "--feeds", str(feeds), "--a=--fast_math=true",
                    "--rounds", "1", "--block", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["a"] == "--fast_math=true" and out["b"] == "" and out["rounds"] == 1


def test_profile_names_the_implementation_a_call_runs_now():
    """A library step's label follows a background switch (MLAS measured slower than
    oneDNN after the step was wrapped): the profile said "mlas" for calls that ran oneDNN."""
    from autoclust.backends.cpu import choice, library

    from autoclust.kernel import ir as kir
    f32 = np.dtype("float32")
    fn = library.make_call("MatMul", {}, [(f32, (64, 96)), (f32, (96, 80))], [(f32, (64, 80))],
                           1, impl="numpy")
    step = choice.in_place(fn, (kir.View((64, 96), (1, 64), 0), None, None), 2)

    def run(*args):  # a step as the executable holds it: a closure over the call
        return step(*args)

    assert bench_profile._library_impl(run) == "numpy"
    fn.switch("ref", fn._current[0], "switched")
    assert bench_profile._library_impl(run) == "ref"


def test_exports_compile_autoclust_to_bytecode_first():
    """The measured child processes import bytecode, as an installed package does: without
    it (an editable checkout, PYTHONDONTWRITEBYTECODE) every one compiled our sources."""
    compiled = [importlib.util.cache_from_source(m.__file__) for m in (flags, timing)]
    if not all(os.access(os.path.dirname(os.path.dirname(p)), os.W_OK) for p in compiled):
        pytest.skip("the installed package is read-only here")
    for path in compiled:
        if os.path.exists(path):
            os.remove(path)
    bench_exports.compile_bytecode()
    assert all(os.path.exists(p) for p in compiled), compiled


def test_a_failed_torch_child_names_where_it_failed():
    """`autoclust bench --torch` keeps a failed child's last line and, from its traceback,
    the innermost frame (a ViT child once died of a UnicodeDecodeError whose line alone
    did not say where)."""
    from autoclust.tools.bench import torch as bench_torch
    stderr = ("noise\nTraceback (most recent call last):\n  File \"/a.py\", line 3, in f\n"
              "    g()\n  File \"/b.py\", line 9, in g\n    h()\n"
              "UnicodeDecodeError: 'ascii' codec can't decode byte 0xe2\n")
    assert bench_torch._failure(stderr) == ("UnicodeDecodeError: 'ascii' codec can't decode "
                                            "byte 0xe2 (at File \"/b.py\", line 9, in g)")
    assert bench_torch._failure("killed\n") == "killed"
    assert bench_torch._failure("") == "failed"
