"""torch.compile(backend="autoclust") on real transformers modules, and frozen parameters.

Each model family of `autoclust bench --torch` at its tiny size (hidden 16-32, 1-2 layers,
random weights: tools/bench/torch_models.py) compiles into one cluster with no eager node,
a pinned kernel count and outputs equal to eager torch at the ONNX path's float32
tolerance. Frozen parameters (importers/torch/freeze.py) are rebuilt whenever one changes,
however it was changed, and never when gradients are needed.
"""

import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install '.[torch]')")
pytest.importorskip("transformers", reason="transformers is not installed")

import numpy as np
from autoclust.importers.torch import freeze
from autoclust.importers.torch import fx as torch_fx
from autoclust.tools.bench import torch_models
from support.torch_dynamo import fresh_dynamo  # noqa: F401 - autouse, every test
from torch import nn

TOL = {"rtol": 1e-4, "atol": 1e-5}




# name -> (kernels of its one cluster, ATen nodes folded to constants, frozen tensors);
# llama and t5 count their sibling projections (Q/K/V, gate/up) as one GEMM each
# (passes/siblings.py; 36 and 28 kernels with --disable_passes=siblings); vit's patch
# embedding and convnext's stem and downsampling Convs are GEMMs over their patches, each
# with the patches' gather as a kernel (passes/patchify.py; 30 and 17 as library Convs);
# convnext's downsampling GEMM writes its NCHW result in place (kernel/views.py), no kernel;
# llama's and neox's rotated K is read by Q.K^T's transB, not copied transposed by a kernel
# of its own (simplify._rows_kept: 30 and 24 kernels before)
MODELS = {
    "bert": (30, 39, 39),
    "gpt2": (25, 43, 28),
    "llama": (28, 68, 21),
    "vit": (32, 13, 38),
    "resnet": (16, 0, 40),
    "t5": (24, 40, 19),
    "convnext": (18, 4, 28),
    "neox": (22, 62, 28),
}


@pytest.mark.parametrize("name", MODELS)
def test_model_is_one_cluster_matching_eager(name):
    model, args = torch_models.build(name, torch_models.TINY)
    fast = torch.compile(model, backend="autoclust")
    with torch.no_grad():
        got, want = fast(*args), model(*args)
    torch.testing.assert_close(got, want, **TOL)
    (report,) = torch_fx.reports()
    assert (len(report.clusters), report.eager, report.failure) == (1, [], None)
    kernels, folded, frozen = MODELS[name]
    assert report.clusters[0].stats()["kernels"] == [kernels]
    assert (len(report.folded), report.frozen) == (folded, frozen)


# ---- frozen parameters ------------------------------------------------------------------------

class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)
        self.register_buffer("scale", torch.full((16,), 0.5))

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) * self.scale + x


def mlp():
    torch.manual_seed(0)
    model = Mlp().eval()
    return model, torch.compile(model, backend="autoclust"), torch.randn(4, 16)


def run(fast, model, x):
    with torch.no_grad():
        got, want = fast(x), model(x)
    torch.testing.assert_close(got, want, **TOL)
    return got


def report():
    (r,) = torch_fx.reports()
    return r


def test_parameters_are_constants_and_weight_transposes_fold():
    model, fast, x = mlp()
    run(fast, model, x)
    r = report()
    assert r.frozen == 5 and r.folded == ["permute", "permute_1"]
    (c,) = r.clusters
    assert "Transpose" not in c.ops and c.stats()["kernels"] == [4]  # 2 GEMMs, 2 kernels
    assert len(r.plan.clusters[0].inputs) == 1  # x alone: the weights are not inputs


CHANGES = {
    "load_state_dict": lambda m: m.load_state_dict(
        {k: v * 2 + 1 for k, v in m.state_dict().items()}),
    "in_place_no_grad": lambda m: m.fc1.weight.mul_(-1),
    "sparse_in_place": lambda m: m.fc1.weight[1, 1].add_(1),  # no sampled element: version
    "data_mul": lambda m: m.fc2.weight.data.mul_(3),          # no version bump
    "data_assign": lambda m: setattr(m.fc1.bias, "data", torch.randn(32)),  # new memory
    "buffer_fill": lambda m: m.scale.data.fill_(2.0),
    "numpy_write": lambda m: np.multiply(m.fc1.weight.detach().numpy(), 0.5,
                                         out=m.fc1.weight.detach().numpy()),
}


@pytest.mark.parametrize("change", CHANGES)
def test_changed_parameter_rebuilds_never_stale(change):
    model, fast, x = mlp()
    before = run(fast, model, x)
    with torch.no_grad():
        CHANGES[change](model)
    after = run(fast, model, x)  # against eager with the changed weights
    assert not torch.allclose(before, after)
    assert report().refreshes == 1
    run(fast, model, x)
    assert report().refreshes == 1  # unchanged since: no rebuild


def test_replaced_parameter_object_rebuilds():
    model, fast, x = mlp()
    run(fast, model, x)
    model.fc2.weight = nn.Parameter(torch.randn(16, 32))
    run(fast, model, x)
    assert report().refreshes == 1


def test_parameters_changing_every_call_stop_being_frozen():
    model, fast, x = mlp()
    run(fast, model, x)
    def change_and_run():
        with torch.no_grad():
            model.fc1.weight.add_(0.1)
        run(fast, model, x)

    for _ in range(freeze.MAX_REFRESHES):
        change_and_run()
    with pytest.warns(RuntimeWarning, match="changed 5 times: they are inputs"):
        change_and_run()
    r = report()
    assert r.frozen == 0 and r.refreshes == freeze.MAX_REFRESHES + 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        change_and_run()  # read as inputs: right without a rebuild
    assert report().refreshes == freeze.MAX_REFRESHES + 1


def test_flag_off_keeps_parameters_inputs():
    torch.manual_seed(0)
    model = Mlp().eval()
    fast = torch.compile(model, backend="autoclust", options={"freeze_params": False})
    x = torch.randn(4, 16)
    run(fast, model, x)
    r = report()
    assert (r.frozen, r.folded) == (0, [])
    assert "Transpose" in r.clusters[0].ops and len(r.plan.clusters[0].inputs) == 6
    with torch.no_grad():
        model.fc1.weight.data.mul_(3)
    run(fast, model, x)


def test_gradients_needed_keep_parameters_inputs():
    model, fast, x = mlp()
    x = x.requires_grad_()
    fast(x).sum().backward()
    r = report()
    assert r.kind == "forward" and r.frozen == 0 and "Transpose" in r.clusters[0].ops
    assert model.fc1.weight.grad is not None


def test_state_dict_of_a_real_model_between_calls():
    model, args = torch_models.build("gpt2", torch_models.TINY)
    fast = torch.compile(model, backend="autoclust")
    with torch.no_grad():
        first = fast(*args)
        torch.manual_seed(1)
        other, _ = torch_models.build("gpt2", torch_models.TINY)
        for p in other.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # different weights, same shapes
        model.load_state_dict(other.state_dict())
        got, want = fast(*args), model(*args)
    torch.testing.assert_close(got, want, **TOL)
    assert not torch.allclose(first, got)
    assert report().refreshes == 1


# ---- the torch boundary -----------------------------------------------------------------------

def test_outputs_are_not_overwritten_by_later_runs():
    model, fast, x = mlp()
    with torch.no_grad():
        a = fast(x)
        kept = a.clone()
        b = fast(x * 2)
        c = fast(x * 3)
    torch.testing.assert_close(a, kept, rtol=0, atol=0)
    assert len({a.data_ptr(), b.data_ptr(), c.data_ptr()}) == 3
    torch.testing.assert_close(b, model(x * 2), **TOL)


# ---- the benchmark ----------------------------------------------------------------------------

def test_bench_torch_times_each_side_and_writes_the_tables():
    from autoclust.tools.bench import torch as bench_torch
    threads = torch.get_num_threads()
    try:
        row = bench_torch.run_one("gpt2", rounds=2, block=1, threads=1,
                                  sides=["eager", "autoclust"], options={},
                                  size=torch_models.TINY)
    finally:
        torch.set_num_threads(threads)
    assert row["eager_ms"] > 0 and row["autoclust_ms"] > 0 and row["autoclust_first_s"] > 0
    assert row["eager_ratio"] == pytest.approx(row["eager_ms"] / row["autoclust_ms"])
    assert (row["graphs"], row["clusters"], row["eager_nodes"]) == (1, 1, 0)
    assert row["kernels"] == MODELS["gpt2"][0] and row["autoclust_err"] < 1e-4
    kept = dict(row, model="t5", title="T5", tuned=False, eager_ratio=2.0)
    text = bench_torch.markdown([row, kept])
    lines = text.splitlines()
    assert lines[2].startswith("| GPT2Model") and f"| 1 / 1 / 0 / {row['kernels']} |" in lines[2]
    assert "| *not tuned for:* |" in text and "| geomean of all 2 |" in text
    kept_at = next(i for i, x in enumerate(lines) if x.startswith("| *not tuned for:* |"))
    assert lines[kept_at + 1].startswith("| T5 |")


def test_bench_torch_merges_processes_into_one_row_with_their_range():
    from autoclust.tools.bench import torch as bench_torch

    def run(eager_ms, ratio):
        return {"model": "gpt2", "title": "GPT2Model", "tuned": True, "eager_ms": eager_ms,
                "autoclust_ms": 10.0, "eager_ratio": ratio, "eager_p25": ratio - 0.1,
                "eager_p75": ratio + 0.1, "autoclust_first_s": 1.0, "autoclust_err": 1e-6}

    rows = bench_torch.merge([run(11.0, 1.1), run(14.0, 1.4), run(12.0, 1.2),
                              {"model": "t5", "tuned": False, "error": "boom"}])
    assert [r["model"] for r in rows] == ["gpt2", "t5"] and rows[1]["error"] == "boom"
    assert rows[0]["processes"] == 3 and rows[0]["eager_ms"] == 12.0
    assert (rows[0]["eager_ratio"], rows[0]["eager_lo"], rows[0]["eager_hi"]) == (1.2, 1.1, 1.4)
    assert "**1.20x** (1.10-1.30) [1.10-1.40 over 3 processes]" in bench_torch.markdown(rows)
