"""torch.compile(backend="autoclust"): blocks match eager torch, clusters and recompiles counted.

Skipped where torch is missing (`pip install ".[torch]"`). Real transformers models are in
test_torch_models.py. Lowerings are checked one ATen op at a time on the interpreter
device (NumPy references, fast to compile) against eager torch; the blocks run compiled on
the CPU backend.
"""

import math
import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install '.[torch]')")

import numpy as np
import torch.nn.functional as F
from autoclust.importers.torch import fx as torch_fx
from autoclust.importers.torch import run as torch_run
from support import paths
from support.torch_dynamo import fresh_dynamo  # noqa: F401 - autouse, every test
from torch import _dynamo, nn

from autoclust.errors import FlagError

TOL = {"rtol": 1e-4, "atol": 1e-4}


# ---- the blocks -----------------------------------------------------------------------------

class AttentionBlock(nn.Module):
    """Pre-LayerNorm attention with an additive mask, then a GELU MLP (BERT/GPT style)."""

    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads) + mask
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaBlock(nn.Module):
    """RMSNorm, rotary embedding, causal attention, SiLU-gated MLP."""

    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(d, 2 * d, bias=False), nn.Linear(d, 2 * d, bias=False)
        self.down = nn.Linear(2 * d, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        hd = d // self.heads
        h = self.norm1(x)
        q, k, v = (lin(h).view(b, t, self.heads, hd).transpose(1, 2)
                   for lin in (self.q, self.k, self.v))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = (q @ k.transpose(-2, -1)) * hd ** -0.5
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + self.o((att @ v).transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class EmbedBlock(nn.Module):
    """Token + position embeddings (Gather on int64 ids), LayerNorm, a GELU MLP."""

    def __init__(self, vocab: int = 50, d: int = 32, max_len: int = 64):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.ln = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = self.ln(self.tok(ids) + self.pos(pos))
        return h + self.fc2(F.gelu(self.fc1(h), approximate="tanh"))


class ConvNet(nn.Module):
    """conv+bn+relu twice, max pooling, global average pooling, a linear head."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 16, 3, padding=1, stride=2), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)
        for bn in (self.b1, self.b2):  # non-trivial running statistics
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        x = F.relu(self.b2(self.c2(x)))
        return self.fc(x.mean((2, 3)))


def rotary(t: int, hd: int):
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
    freqs = torch.outer(torch.arange(t).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def block_inputs(name: str, batch: int = 2, seq: int = 8, d: int = 32, heads: int = 4):
    """(module, example inputs) for a block at the given sizes (random, seeded)."""
    torch.manual_seed(0)
    if name == "attention":
        mask = torch.zeros(1, 1, seq, seq)
        mask[..., seq // 2:] = -1e4  # masked keys
        return AttentionBlock(d, heads).eval(), (torch.randn(batch, seq, d), mask)
    if name == "llama":
        return LlamaBlock(d, heads).eval(), (torch.randn(batch, seq, d), *rotary(seq, d // heads))
    if name == "embed":
        return EmbedBlock(d=d, max_len=max(64, seq)).eval(), (torch.randint(0, 50, (batch, seq)),)
    if name == "convnet":
        return ConvNet().eval(), (torch.randn(batch, 3, 4 * seq, 4 * seq),)
    raise ValueError(name)


# ---- helpers -------------------------------------------------------------------------------



def counts(fn):
    """(graphs, clusters, eager nodes) over fn's reports; no graph may have run whole eager."""
    rs = torch_fx.reports(fn)
    assert [r.failure for r in rs] == [None] * len(rs)
    return len(rs), sum(len(r.clusters) for r in rs), sum(len(r.eager) for r in rs)


def compiles(fn):
    """Compile count of every cluster of fn's graphs, in order."""
    return [c.stats()["compiles"] for r in torch_fx.reports(fn) for c in r.clusters]


def check(fast, model, *args):
    with torch.no_grad():
        got, want = fast(*args), model(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, **TOL)
    return got


# ---- the backend ---------------------------------------------------------------------------

def test_backend_is_registered_by_entry_point():
    from torch._dynamo.backends.registry import list_backends, lookup_backend
    assert "autoclust" in list_backends()
    assert lookup_backend("autoclust") is torch_fx.autoclust_backend


# name -> (clusters, eager ATen nodes, ATen nodes folded to constants) at the default flags;
# the parameters are frozen, so each Linear's weight transpose (permute) folds
BLOCKS = {
    "attention": (1, 0, 4),      # 4 Linear weights' permutes
    "llama": (1, 0, 17),         # 3 weights, the causal mask (full, arange x2, -inf, ...)
    "embed": (1, 0, 4),          # arange(seq), its position embedding, 2 weights

    # the whole net is one cluster: the convolutions are library calls with BatchNorm, ReLU
    # and pooling fused around them (the CPU policy's "leave Conv to onnxruntime" is for
    # onnxruntime's fused kernels; eager torch fuses nothing: torch_fx.eager_policy)
    "convnet": (1, 0, 1),        # the classifier's weight
}


@pytest.mark.parametrize("name", BLOCKS)
def test_block_matches_eager_with_cluster_counts(name):
    model, args = block_inputs(name)
    fast = torch.compile(model, backend="autoclust")
    check(fast, model, *args)
    clusters, eager, folded = BLOCKS[name]
    assert counts(fast) == (1, clusters, eager)
    (report,) = torch_fx.reports(fast)
    assert len(report.folded) == folded
    assert report.covered() + len(report.eager) + folded == report.aten_nodes
    assert compiles(fast) == [1] * clusters
    check(fast, model, *args)  # a second run reuses the executable
    assert compiles(fast) == [1] * clusters


def test_convnet_compiles_whole_under_must_compile():
    model, args = block_inputs("convnet")
    fast = torch.compile(model, backend="autoclust", options={"must_compile": True})
    check(fast, model, *args)
    (report,) = torch_fx.reports(fast)
    assert (len(report.clusters), len(report.eager)) == (1, 0)
    ops = report.clusters[0].ops
    assert ops["Conv"] == 2 and ops["BatchNormalization"] == 2 and ops["MaxPool"] == 1


def test_explain_text_and_json():
    model, args = block_inputs("attention")
    fast = torch.compile(model, backend="autoclust")
    check(fast, model, *args)
    text = torch_fx.explain(fast)
    assert "1 cluster covering 46" in text and "native_layer_norm x2" in text
    assert "4 folded to constants, 12 parameters frozen" in text
    assert "LayerNormalization x2" in text and "compiled 1x, ran 1x" in text
    data = torch_fx.explain(fast, as_json=True)
    (graph,) = data["graphs"]
    assert graph["kind"] == "inference" and graph["where"].startswith("forward (")
    (c,) = graph["clusters"]
    assert c["aten_ops"]["addmm"] == 4 and c["ops"]["Gemm"] == 4 and c["runs"] == 1
    other = torch.compile(lambda x: x.sin().cos().exp().tanh(), backend="autoclust")
    other(torch.randn(4))
    assert len(torch_fx.reports()) == 2 and len(torch_fx.reports(fast)) == 1
    assert "no graph compiled" in torch_fx.explain(block_inputs("llama")[0])


def test_graph_break_print_falls_back_between_graphs(capsys):
    def f(x):
        y = (x * 2 + 1).exp().sin()
        print("graph break here")
        return (y - x).relu().sqrt() * 3

    fast = torch.compile(f, backend="autoclust", options={"min_cluster_size": 2})
    x = torch.randn(16)
    torch.testing.assert_close(fast(x), f(x), **TOL)
    assert "graph break here" in capsys.readouterr().out
    assert counts(fast) == (2, 2, 0)  # one graph before the print, one after (resume fn)
    where = [r.where for r in torch_fx.reports(fast)]
    assert where[0].startswith("f (") and "torch_dynamo_resume_in_f_at_" in where[1]


def test_graph_break_item_runs_python_between_graphs():
    def f(x):
        s = (x * x).sum().item()  # a Python float: Dynamo breaks the graph here
        return (x / s + 1).tanh() * 2

    fast = torch.compile(f, backend="autoclust", options={"min_cluster_size": 2})
    x = torch.randn(8)
    for _ in range(2):
        torch.testing.assert_close(fast(x), f(x), **TOL)
    assert counts(fast) == (2, 2, 0)  # x*x, sum | Python .item() | the rest, clustered
    y = torch.randn(8)  # a new float: Dynamo recompiles the resumed graph
    torch.testing.assert_close(fast(y), f(y), **TOL)
    assert counts(fast)[0] == 3


def test_unsupported_ops_run_eager_with_reasons():
    def f(x):
        y = (x * 2).exp()
        top = torch.topk(y, 2, dim=-1).values  # no lowering
        z = y.to(torch.bfloat16).float()          # bfloat16 has no numpy dtype
        return top.sum(-1) + (z + y).sigmoid().sum(-1)

    fast = torch.compile(f, backend="autoclust", options={"min_cluster_size": 1})
    x = torch.randn(3, 5)
    torch.testing.assert_close(fast(x), f(x), **TOL)
    (report,) = torch_fx.reports(fast)
    assert report.eager == [
        ("topk", "aten.topk.default", "no lowering for aten.topk.default"),
        ("_to_copy", "aten._to_copy.default", "output dtype torch.bfloat16 has no numpy type"),
        ("_to_copy_1", "aten._to_copy.default",
         "argument _to_copy has dtype torch.bfloat16, which numpy cannot hold")]
    # compiled work on both sides of the eager nodes: mul+exp | add, sigmoid, sums
    assert [c.aten_ops for c in report.clusters] == [
        {"exp": 1, "mul": 1}, {"add": 2, "sum": 2, "sigmoid": 1}]


class TwoBlocks(nn.Module):
    """The attention block, a graph break, then the llama block."""

    def __init__(self):
        super().__init__()
        self.att, self.llama = AttentionBlock(), LlamaBlock()

    def forward(self, x, mask, cos, sin):
        h = self.att(x, mask)
        _dynamo.graph_break()
        return self.llama(h, cos, sin)


def test_graph_break_inside_a_model_clusters_each_graph():
    torch.manual_seed(0)
    model = TwoBlocks().eval()
    args = (torch.randn(2, 8, 32), block_inputs("attention")[1][1], *rotary(8, 8))
    fast = torch.compile(model, backend="autoclust")
    check(fast, model, *args)
    check(fast, model, *args)
    assert counts(fast) == (2, 2, 0)  # each half one graph, each graph one cluster
    assert compiles(fast) == [1, 1]
    first, second = torch_fx.reports(fast)
    assert "native_layer_norm" in first.clusters[0].aten_ops   # attention's LayerNorm
    assert "rsqrt" in second.clusters[0].aten_ops              # llama's RMSNorm
    assert "torch_dynamo_resume_in_forward_at_" in second.where


class SortInside(nn.Module):
    """LayerNorm-Linear-GELU, a sort (no lowering), then Linear and RMSNorm."""

    def __init__(self, d: int = 32):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.norm = RMSNorm(d)

    def forward(self, x):
        h = F.gelu(self.fc1(self.ln(x))).sort(-1).values
        return self.norm(x + self.fc2(h))


def test_unsupported_op_inside_a_block_runs_eager_between_clusters():
    torch.manual_seed(0)
    model = SortInside().eval()
    fast = torch.compile(model, backend="autoclust")
    check(fast, model, torch.randn(2, 8, 32))
    (report,) = torch_fx.reports(fast)
    assert report.eager == [("sort", "aten.sort.default", "no lowering for aten.sort.default")]
    before, after = (c.aten_ops for c in report.clusters)
    assert {"native_layer_norm", "gelu", "addmm"} <= set(before)   # feeds the sort
    assert {"addmm", "rsqrt", "mean", "pow"} <= set(after)          # reads the sorted values
    assert counts(fast) == (1, 2, 1)
    assert [c.stats()["runs"] for c in report.clusters] == [1, 1]
    text = torch_fx.explain(fast)
    assert "2 clusters covering 15, 1 run as eager torch, 2 folded to constants" in text
    assert "eager sort (aten.sort.default): no lowering for aten.sort.default" in text


def test_must_compile_names_the_unsupported_node():
    fast = torch.compile(lambda x: torch.topk(x.exp(), 2).values, backend="autoclust",
                         options={"must_compile": True})
    with pytest.raises(Exception, match=r"(?s)NotCompilableError.*topk \(aten.topk.default\)"):
        fast(torch.randn(3, 5))


def test_options_are_flags():
    model, args = block_inputs("attention")
    fast = torch.compile(model, backend="autoclust", options={"min_cluster_size": 1000})
    check(fast, model, *args)
    assert counts(fast) == (1, 0, 46)  # 50 ATen nodes, 4 weight permutes folded
    with pytest.raises(FlagError, match="unknown flag --no_such_flag"):
        torch_fx.backend(no_such_flag=1)


# ---- shapes and recompiles ---------------------------------------------------------------------

def test_new_shape_recompiles_static_graphs():
    model, (x, mask) = block_inputs("attention", seq=8)
    fast = torch.compile(model, backend="autoclust", dynamic=False)
    check(fast, model, x, mask)
    x2, mask2 = torch.randn(2, 12, 32), torch.zeros(1, 1, 12, 12)
    check(fast, model, x2, mask2)
    check(fast, model, x, mask)  # the first graph still serves the first shape
    assert counts(fast) == (2, 2, 0)  # Dynamo: one graph per shape; ours: one compile each
    assert compiles(fast) == [1, 1]


def test_automatic_dynamic_then_one_graph_many_sizes():
    model, (x, mask) = block_inputs("attention", seq=8)
    fast = torch.compile(model, backend="autoclust")  # dynamic=None: static, then symbolic
    check(fast, model, x, mask)
    for t in (12, 16, 12):
        check(fast, model, torch.randn(2, t, 32), torch.zeros(1, 1, t, t))
    assert counts(fast) == (2, 2, 0)  # Dynamo recompiled once, with a symbolic seq dim
    assert compiles(fast) == [1, 2]   # the symbolic graph compiled for 12 and 16
    dims = [v.shape for v in torch_fx.reports(fast)[1].plan.graph.inputs if v.shape]
    assert any(isinstance(d, str) for s in dims for d in s)


def test_dynamic_true_reuses_one_graph():
    model, _ = block_inputs("llama")
    fast = torch.compile(model, backend="autoclust", dynamic=True)
    # seq 8 would equal the head size: Dynamo would give both one symbol and recompile later
    for t in (6, 5, 6, 11):
        c, s = rotary(t, 8)
        check(fast, model, torch.randn(3, t, 32), c, s)
    assert counts(fast) == (1, 1, 0)
    assert compiles(fast) == [3]  # seq 6, 5 and 11; the second seq 6 reuses
    (report,) = torch_fx.reports(fast)
    assert report.clusters[0].stats()["runs"] == 4
    x_value = report.plan.graph.inputs[0]  # batch and seq symbolic; d specialized by view
    assert [isinstance(d, str) for d in x_value.shape] == [True, True, False]


def test_mark_dynamic_dims_are_symbolic_in_the_graph():
    model, (ids,) = block_inputs("embed", batch=2, seq=8)
    _dynamo.mark_dynamic(ids, 0)
    fast = torch.compile(model, backend="autoclust")
    check(fast, model, ids)
    for b in (3, 5):
        check(fast, model, torch.randint(0, 50, (b, 8)))
    (report,) = torch_fx.reports(fast)
    (ids_value,) = [v for v in report.plan.graph.inputs if v.dtype == np.int64]
    assert isinstance(ids_value.shape[0], str) and ids_value.shape[1] == 8
    assert compiles(fast) == [3]


def test_mark_dynamic_batch_through_the_compiled_convnet():
    model, (x,) = block_inputs("convnet")
    _dynamo.mark_dynamic(x, 0)
    fast = torch.compile(model, backend="autoclust", options={"must_compile": True})
    check(fast, model, x)
    for b in (3, 5, 3):
        check(fast, model, torch.randn(b, 3, 32, 32))
    assert counts(fast) == (1, 1, 0)
    assert compiles(fast) == [3]  # batch 2, 3 and 5
    (report,) = torch_fx.reports(fast)
    (image,) = [v for v in report.plan.graph.inputs if v.shape[-1:] == (32,)]
    assert isinstance(image.shape[0], str) and image.shape[1:] == (3, 32, 32)
    check(fast, model, torch.randn(1, 3, 32, 32))  # Dynamo specializes sizes 0 and 1
    assert counts(fast) == (2, 2, 0) and compiles(fast) == [3, 1]


def test_new_dtype_recompiles():
    def f(x, y):
        return (x * y + 1).exp().tanh() - y

    fast = torch.compile(f, backend="autoclust", options={"min_cluster_size": 2})
    x, y = torch.randn(4, 5), torch.randn(5)
    for a, b in ((x, y), (x.double(), y.double()), (x, y), (x.double(), y)):
        got = fast(a, b)
        assert got.dtype == f(a, b).dtype
        torch.testing.assert_close(got, f(a, b), **TOL)
    assert counts(fast) == (3, 3, 0)  # float32, float64, mixed: one graph each
    assert compiles(fast) == [1, 1, 1]
    assert [r.plan.graph.inputs[0].dtype for r in torch_fx.reports(fast)] == [
        np.float32, np.float64, np.float64]


# ---- inputs, fallbacks, training ----------------------------------------------------------------

def test_tensors_cross_without_copies():
    t = torch.randn(4, 6, requires_grad=True)
    a = torch_run.to_array(t)
    assert a.__array_interface__["data"][0] == t.data_ptr()
    s = t.detach().t()  # strided views stay views
    assert torch_run.to_array(s).__array_interface__["data"][0] == s.data_ptr()
    out = np.ones(3, np.float32)
    assert torch.from_numpy(out).data_ptr() == out.__array_interface__["data"][0]


def test_strided_zero_size_and_special_values():
    def f(x, y):
        return ((x * 2).softmax(-1) + y.amax(-1, keepdim=True)).exp() * 0.5

    fast = torch.compile(f, backend="autoclust", dynamic=False,
                         options={"min_cluster_size": 1})
    x = torch.randn(6, 4).t()  # non-contiguous
    y = torch.randn(4, 6)
    y[1, 2], y[2, 0], y[3] = float("nan"), float("inf"), -float("inf")
    torch.testing.assert_close(fast(x, y), f(x, y), equal_nan=True)
    e = torch.randn(0, 6)
    torch.testing.assert_close(fast(e, e), f(e, e))


def test_compile_failure_falls_back_to_eager_with_one_warning(monkeypatch):
    import autoclust.compile

    def broken(*args, **kwargs):
        raise RuntimeError("injected compile failure")

    monkeypatch.setattr(autoclust.compile, "compile_cluster", broken)
    model, args = block_inputs("attention")
    fast = torch.compile(model, backend="autoclust")
    with pytest.warns(RuntimeWarning, match="falls back to eager torch.*injected"):
        check(fast, model, *args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check(fast, model, *args)  # no second warning, still right
    (c,) = torch_fx.reports(fast)[0].clusters
    assert "injected compile failure" in c.stats()["fallback"]


def test_megamorphic_cluster_falls_back_to_eager():
    fast = torch.compile(lambda x: (x * 2 + 1).exp().sin(), backend="autoclust", dynamic=True,
                         options={"megamorphic_compiles": 2, "min_cluster_size": 2,
                                  "device": "interpreter"})
    xs = [torch.randn(n) for n in range(3, 8)]
    with pytest.warns(RuntimeWarning, match="megamorphic"):
        got = [fast(x) for x in xs]
    for g, x in zip(got, xs):
        torch.testing.assert_close(g, (x * 2 + 1).exp().sin(), **TOL)
    (c,) = torch_fx.reports(fast)[0].clusters
    assert c.stats()["compiles"] == 2 and "megamorphic" in c.stats()["fallback"]


def test_grad_mode_compiles_forward_and_backward_runs_eager():
    model, (x, mask) = block_inputs("attention")
    fast = torch.compile(model, backend="autoclust")
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    fast(x1, mask).square().sum().backward()
    model(x2, mask).square().sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, **TOL)
    (report,) = torch_fx.reports(fast)
    assert report.kind == "forward" and len(report.clusters) == 1


def test_dump_to_writes_plan_and_clusters(tmp_path):
    model, args = block_inputs("attention")
    fast = torch.compile(model, backend="autoclust", options={"dump_to": str(tmp_path)})
    check(fast, model, *args)
    files = {p.name for p in (tmp_path / "graph_0").iterdir()}
    assert {"clustering.txt", "aten_graph.py", "explain.txt", "cluster_0000.onnx",
            "cluster_0000.kernels.txt"} <= files


# ---- one lowering at a time ---------------------------------------------------------------------

def aten_compiled(fn, args, tracing_mode="fake"):
    """fn traced to core ATen (make_fx, no Dynamo) and compiled whole on the interpreter."""
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    from autoclust import flags
    gm = make_fx(fn, decomposition_table=core_aten_decompositions(),
                 tracing_mode=tracing_mode)(*args)
    report = torch_run.GraphReport(0, "inference")
    f = flags.parse(device="interpreter", min_cluster_size=1, must_compile=True, threads=1)
    return torch_fx.compile_aten(gm, f, report), report


def assert_same(got, want):
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g.dtype, g.shape) == (w.dtype, w.shape)
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, equal_nan=True)


X, Y = torch.randn(3, 4, 5), torch.randn(4, 5)
XN = torch.tensor([[1.0, float("nan"), -2.0], [float("inf"), 0.5, -float("inf")]])
I = torch.randint(-5, 5, (3, 4, 5))
IMG, W = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
LOWERING_CASES = {
    "add_alpha": (lambda a, b: torch.add(a, b, alpha=2), X, Y),
    "sub_scalar": (lambda a: 1.5 - a, X),
    "int_times_float": (lambda a: a * 0.5, I),
    "int_true_div": (lambda a: a / 3, I),
    "floor_div": (lambda a: torch.div(a, 0.7, rounding_mode="floor"), X),
    "trunc_div": (lambda a: torch.div(a, 0.7, rounding_mode="trunc"), X),
    "pow": (lambda a: a ** 3 + 2 ** a, X),
    "compare": (lambda a, b: (a > b) & (a != 0.5) | (a <= -1), X, Y),
    "where": (lambda a, b: torch.where(a > 0, a, b) + torch.where(a < 0, a, 0.0), X, Y),
    "clamp": (lambda a: a.clamp(-0.5, 0.5) + a.clamp(min=0.1) + F.relu6(a), X),
    "clamp_nan": (lambda a: a.clamp(-1, 1), XN),
    # one bound: torch keeps +-inf (ONNX Clip would make it FLT_MAX): Max/Min, not Clip
    "clamp_one_bound_inf": (lambda a: (a.clamp(min=0.5), a.clamp(max=-0.5)), XN),
    "unary": (lambda a: a.exp() + a.abs().log() + a.sigmoid() + a.tanh() + a.sin() +
              torch.rsqrt(a.abs() + 1) + torch.erf(a) + a.floor() + a.round(), X),
    "activations": (lambda a: F.gelu(a, approximate="tanh") + F.silu(a) + F.elu(a) +
                    F.leaky_relu(a, 0.2) + F.hardswish(a) + F.hardsigmoid(a), X),
    "reductions": (lambda a: a.sum((0, 2)).sum() + a.mean(-1, keepdim=True) + a.prod(-1,
                   keepdim=True) + a.var(-1, keepdim=True), X),
    "sum_all_and_int": (lambda a, i: (a.sum() + i.sum(-1)), X, I),
    "amax_nan": (lambda a: (a.amax(-1), a.amin(0, keepdim=True)), XN),
    "argmax": (lambda a: (a.argmax(-1), a.argmin(), a.argmax(1, keepdim=True)), X),
    "softmax": (lambda a: (a.softmax(1), a.log_softmax(-1)), X),
    "layer_norm": (lambda a: F.layer_norm(a, (4, 5)), X),
    "layer_norm_stats": (lambda a, w: torch.ops.aten.native_layer_norm(a, [5], w, None, 1e-5),
                         X, torch.randn(5)),
    "group_norm": (lambda a: F.group_norm(a, 2, torch.ones(4), torch.zeros(4)),
                   torch.randn(2, 4, 3, 3)),
    "batch_norm": (lambda a, m, v, w, b: F.batch_norm(a, m, v, w, b, False, 0.1, 1e-5),
                   torch.randn(2, 3, 4, 4), torch.randn(3), torch.rand(3) + 0.5,
                   torch.randn(3), torch.randn(3)),
    "view_permute": (lambda a: a.reshape(3, 20).t().contiguous().view(4, 5, 3)
                     .permute(2, 0, 1), X),
    "expand_slice_select": (lambda a: (a[:, :1].expand(3, 4, 5) + a[:, 1:4:2].sum(1, True)
                                       + a[1, :, 2].view(1, 4, 1), a[..., -3:]), X),
    "squeeze_unsqueeze": (lambda a: a.unsqueeze(1).squeeze(1).squeeze(0) + 1, X),
    "cat_mixed_dtypes": (lambda a, i: torch.cat([a, i, a[:1]], 0), X, I),
    "split_chunk": (lambda a: [t * 2 for t in a.split([1, 3], 1)] +
                    [t + 1 for t in a.chunk(3, 2)], X),
    "index_embedding_gather": (lambda a, w, ix: (a[ix], a[:, ix], F.embedding(ix.abs(), w),
                                                 a.gather(1, ix.abs().view(1, 3, 1)
                                                          .expand(3, 3, 5))),
                               X, torch.randn(10, 4), torch.tensor([2, 0, -1])),
    "index_several_tensors": (lambda a, i, j: (a[i, j], a[:, i, j], a[i, :, j],
                                                a[torch.arange(3).view(3, 1), i.view(1, 3)]),
                              X, torch.tensor([2, 0, -1]), torch.tensor([[1], [3]])),
    "any_all_full_like": (lambda a, m: (a.gt(0).any(-1, keepdim=True), a.any(0), m.all(1),
                                        torch.full_like(a, 3.0), torch.zeros_like(m),
                                        (a == float("inf")).any()),
                          XN, torch.tensor([[True, False], [True, True]])),
    "pad_repeat_flip": (lambda a: (F.pad(a, (1, 2, 0, 1), value=0.5), a.repeat(2, 1, 1, 1),
                                   a.flip(0, 2)), X),
    "matmuls": (lambda a, b, w, c: (a @ b, F.linear(a, w, c)), X, torch.randn(3, 5, 2),
                torch.randn(6, 5), torch.randn(6)),
    "conv": (lambda a, w, b: F.conv2d(a, w, b, stride=2, padding=1), IMG, W, torch.randn(4)),
    "conv_groups_dilated": (lambda a, w: F.conv2d(a, w, None, padding=1, groups=2,
                                                  dilation=2), torch.randn(2, 4, 8, 8),
                            torch.randn(4, 2, 3, 3)),
    "conv_transpose": (lambda a, w: F.conv_transpose2d(a, w, stride=2, padding=1,
                                                       output_padding=1),
                       torch.randn(2, 3, 5, 5), torch.randn(3, 4, 3, 3)),
    "pooling": (lambda a: (F.max_pool2d(a, 3, 2, 1), F.avg_pool2d(a, 2),
                           F.avg_pool2d(a, 3, 2, 1, count_include_pad=False),
                           F.adaptive_avg_pool2d(a, 1)), IMG),
    "factories": (lambda a: a + torch.arange(5) + torch.full((4, 5), 2.0) +
                  torch.ones(4, 4).tril()[:, :1], X),
    "casts_and_logic": (lambda a: (a.to(torch.float64) * 2, (a > 0) | ~(a < -1),
                                   (a * 5).to(torch.int32) // 3,
                                   torch.div((a * 5).to(torch.int64), -2, rounding_mode="trunc")),
                          X),
    "mod": (lambda a, i: (torch.fmod(a, 0.3), i % 3, torch.maximum(a, a.flip(0))), X, I),
    "cumsum": (lambda a, i: (a.cumsum(1), i.cumsum(-1)), X, I),
}


@pytest.mark.parametrize("name", LOWERING_CASES)
def test_lowering_matches_eager(name):
    fn, *args = LOWERING_CASES[name]
    compiled, report = aten_compiled(fn, args)
    assert_same(compiled(*args), fn(*args))
    assert report.clusters and not report.eager


SYMBOLIC_CASES = {
    "heads": lambda x: x.view(x.shape[0], x.shape[1], 4, 4).transpose(1, 2)
    .reshape(x.shape[0] * 4, x.shape[1], 4) * 2,
    "flatten": lambda x: x.reshape(-1, 16).sum(0) + x.flatten(0, 1).mean(0),
    "expand": lambda x: x[:, :1, :].expand(-1, x.shape[1], -1) + x,
    "slice_to_size": lambda x: x[:, 1:x.shape[1] - 1] * 3,
    "causal_softmax": lambda x: (x @ x.transpose(1, 2)).masked_fill(
        torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1), float("-inf")).softmax(-1),
    "arange": lambda x: x + torch.arange(x.shape[1]).unsqueeze(-1).float(),
    "full": lambda x: torch.cat([x, torch.full((x.shape[0], x.shape[1], 2), 1.5)], -1),
    "times_size": lambda x: x * x.shape[1],
}


@pytest.mark.parametrize("name", SYMBOLIC_CASES)
def test_symbolic_sizes_lower_to_shape_computations(name):
    fn = SYMBOLIC_CASES[name]
    compiled, report = aten_compiled(fn, [torch.randn(2, 5, 16)], tracing_mode="symbolic")
    for b, t in ((2, 5), (3, 7), (1, 1)):
        x = torch.randn(b, t, 16)
        assert_same(compiled(x), fn(x))
    (c,) = report.clusters
    assert c.stats()["compiles"] == 3 and not report.eager


def test_constants_made_in_forward_join_the_cluster():
    def f(x):
        c = torch.tensor([1.0, 2.0, 3.0])  # a lifted constant (get_attr in the ATen graph)
        return ((x + c) * c).exp().sum(-1) + torch.ones(3).cumsum(0)[-1]

    fast = torch.compile(f, backend="autoclust", options={"min_cluster_size": 1})
    x = torch.randn(4, 3)
    torch.testing.assert_close(fast(x), f(x), **TOL)
    (report,) = torch_fx.reports(fast)
    # the lifted constant's copy and everything computed from constants alone fold
    assert counts(fast) == (1, 1, 0)
    assert report.folded == ["lift_fresh_copy", "full", "cumsum", "select"]


def test_aten_node_split_across_a_cluster_boundary_runs_eager():
    # amax lowers to six ops; excluding Where from clusters would split it: it stays whole
    def f(x):
        return (x * 2).amax(-1).exp() + 1

    fast = torch.compile(f, backend="autoclust",
                         options={"min_cluster_size": 1, "cluster_exclude_ops": "Where"})
    x = torch.randn(4, 6)
    torch.testing.assert_close(fast(x), f(x), **TOL)
    (report,) = torch_fx.reports(fast)
    assert report.failure is None
    reason = "aten.amax.default lowers to 6 ops that did not all join one cluster"
    assert report.eager == [("amax", "aten.amax.default", reason)]
    assert [c.aten_ops for c in report.clusters] == [{"mul": 1}, {"add": 1, "exp": 1}]


def test_input_mutation_and_training_batch_norm_update_state():
    def f(x, y):
        x.add_(1)
        y.mul_(2).exp_()
        return (x * 2).sin() + y.cos()

    fast = torch.compile(f, backend="autoclust", options={"min_cluster_size": 1})
    a, b = torch.randn(5), torch.randn(5)
    a2, b2 = a.clone(), b.clone()
    torch.testing.assert_close(fast(a, b), f(a2, b2), **TOL)
    torch.testing.assert_close((a, b), (a2, b2), **TOL)
    torch.manual_seed(1)
    bn, bn2 = nn.BatchNorm1d(5).train(), nn.BatchNorm1d(5).train()
    fast_bn = torch.compile(bn, backend="autoclust", options={"min_cluster_size": 1})
    x = torch.randn(8, 5)
    with torch.no_grad():
        torch.testing.assert_close(fast_bn(x), bn2(x), **TOL)
    torch.testing.assert_close(bn.running_mean, bn2.running_mean, **TOL)
    (report,) = torch_fx.reports(fast_bn)  # found through Dynamo's wrapper of nn modules
    assert report.where.startswith("forward (") and "batchnorm.py" in report.where
    assert [t for _, t, _ in report.eager] == [
        "aten._native_batch_norm_legit_functional.default"]


def test_docs_example_prints_what_the_page_shows(capsys):
    """docs/torch.md's example, run as written: its explain output is the page's."""
    import os
    import re
    path = os.path.join(paths.REPO, "docs", "torch.md")
    with open(path) as f:
        page = f.read()
    code = re.search(r"```python\n(import torch.*?)```", page, re.DOTALL).group(1)
    shown = re.search(r"prints\n\n```\n(.*?)```", page, re.DOTALL).group(1)
    exec(compile(code, "./example.py", "exec"), {"__name__": "example"})  # noqa: S102
    printed = capsys.readouterr().out
    assert printed == shown
