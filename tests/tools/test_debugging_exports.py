"""bisect and minify on real-export-shaped graphs (tests/support/exports.py).

The dynamo exporter's own output of a 2-layer grouped-query LLaMA (RoPE, RMSNorm, SiLU;
generated here when torch and transformers import, about 10 s), the zoo's LLaMA block with
its scalars as initializers as that exporter writes them (no torch needed), and the
BERT-base export for the time budget (marked speed). Each bisect runs as a user runs
it (`autoclust bisect` with --flags=--inject_bug=...) and must name the node the fault went
into: the first node of the op in graph order, in these one-cluster models.
"""

import argparse
import json
import os
import time

import numpy as np
import onnx
import pytest
from autoclust.tools.debug import bisect, minify, repro
from autoclust.tools.debug import replay as replay_tool
from autoclust.tools.fuzz import check as fuzz_check
from support import exports, stolen


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(model path, input_ids .npy path) of the exported grouped-query LLaMA."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("llama")
    feeds = exports.llama_export(str(folder / "llama.onnx"))
    np.save(folder / "ids.npy", feeds["input_ids"])
    return str(folder / "llama.onnx"), str(folder / "ids.npy")


def run_bisect(capsys, tmp_path, model, bug, *args):
    code = bisect.main([model, f"--flags=--inject_bug={bug}", "--out", str(tmp_path / "b"),
                        *args])
    out = capsys.readouterr().out
    assert code == 1, out
    with open(tmp_path / "b" / "bisect.json") as f:
        return json.load(f), out


def first_of(model_path, op):
    return next(n.name for n in onnx.load(model_path).graph.node if n.op_type == op)


def replays(path, flags):
    args = {"cluster": path, "device": None, "rtol": 1e-4, "atol": 1e-5, "repeat": 1}
    return replay_tool.main(argparse.Namespace(flags=flags, **args))


@pytest.mark.parametrize("bug, kind", [
    ("accuracy:Softmax", "mismatch"),         # attention over the -FLT_MAX causal mask
    ("accuracy:Neg", "mismatch"),             # RoPE's rotate_half
    ("accuracy:Pow", "mismatch"),             # RMSNorm's x^2
    ("compile_error:Sigmoid", "compile_fallback"),  # SiLU
])
def test_bisect_names_the_injected_node_in_a_gqa_llama_export(llama, capsys, tmp_path, bug,
                                                              kind):
    path, ids = llama
    result, out = run_bisect(capsys, tmp_path, path, bug, "--input", f"input_ids={ids}")
    op = bug.split(":")[1]
    assert (result["node"], result["op"]) == (first_of(path, op), op), out
    assert result["node_failure"].startswith(kind) and result["repro_nodes"] == 1, out
    assert f"{path}: inputs from --input;" in out
    if kind == "mismatch":
        assert replays(result["repro"], f"--inject_bug={bug}") == 1
        assert replays(result["repro"], None) == 0


def test_the_oracle_sees_a_bug_behind_rmsnorm_in_the_export(llama):
    # Item 9 of issue 24: the spread jittered RMSNorm's exponent 2.0 (an initializer in
    # this export) to 2.0000002, Pow of a negative was NaN, and every difference passed.
    path, ids = llama
    model, feeds = onnx.load(path), {"input_ids": np.load(ids)}
    outcome = fuzz_check.check(model, feeds, [{"inject_bug": "accuracy:Softmax"}])
    assert outcome.kind == "mismatch" and "elements differ" in outcome.message, outcome
    assert fuzz_check.check(model, feeds, [{}]).kind == "ok"


def test_minify_shrinks_the_export_to_the_softmax(llama, capsys, tmp_path):
    path, ids = llama
    np.save(tmp_path / "ids.npy", np.load(ids))
    flags = "--flags=--inject_bug=accuracy:Softmax"
    assert minify.main([path, "--input", f"input_ids={tmp_path / 'ids.npy'}", flags,
                        "--out", str(tmp_path / "m")]) == 1
    small = onnx.load(tmp_path / "m" / "model.onnx")
    assert [n.op_type for n in small.graph.node] == ["Softmax"], capsys.readouterr().out
    assert replays(str(tmp_path / "m"), "--inject_bug=accuracy:Softmax") == 1


def test_bisect_a_zoo_llama_with_dynamo_scalars(capsys, tmp_path):
    from autoclust.models import zoo
    model = exports.dynamo_style(zoo.build("llama_block"))
    assert any(t.name.endswith("Constant_output_0") for t in model.graph.initializer)
    path = str(tmp_path / "llama_block.onnx")
    onnx.save(model, path)
    result, out = run_bisect(capsys, tmp_path, path, "accuracy:Softmax")
    assert result["node"] == "/model/layers.0/self_attn/Softmax", out
    minify_out = str(tmp_path / "m")
    assert minify.main([result["repro"], "--flags=--inject_bug=accuracy:Softmax", "--out",
                        minify_out]) == 1
    assert [n.op_type for n in onnx.load(minify_out + "/model.onnx").graph.node] == ["Softmax"]
    expected = repro.load_arrays(minify_out + "/expected.npz")
    assert set(expected) == {"/model/layers.0/self_attn/Softmax_output_0"}


# BERT-base (transformers, random weights, dynamo export, seq 128; tools/bench/exports.py
# caches the export in ~/.cache/autoclust/exports): issue 24 measured 341 s for 16 trials
# when every trial rebuilt onnxruntime's reference and recompiled; 19 s on an otherwise idle
# 2-core machine since (docs/debugging.md). The budget is the target, 3x that.
BERT_BASE_BUDGET_S = 60.0


@pytest.mark.speed
def test_bisect_bert_base_in_under_a_minute(capsys, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from autoclust.tools.bench import exports as bench_exports
    path, _ = bench_exports.export("bert", bench_exports.default_cache(), log=lambda s: None)
    start = time.perf_counter()
    with stolen.Meter() as meter:
        result, out = run_bisect(capsys, tmp_path, path, "accuracy:Softmax")
    seconds = time.perf_counter() - start
    assert "saved inputs" in out and result["node"] == first_of(path, "Softmax"), out
    assert seconds < meter.budget(BERT_BASE_BUDGET_S), \
        f"bisect took {seconds:.1f} s, {meter}:\n{out}"
    assert os.path.getsize(result["repro"] + ".onnx") < 1 << 20  # the node, not the weights
