"""The fuzz generator: valid graphs, exact shape bookkeeping, and every edge case it promises.

The coverage table lists what the generator must produce within a few hundred cases; each
entry is one of the held-out fuzzer's findings (issue 8) or an op real exports use, so a
generator change that silently stops producing one fails here.
"""

import collections

import numpy as np
import onnx
import pytest
from autoclust.tools.fuzz import build as fuzz_build
from autoclust.tools.fuzz import check as fuzz_check
from autoclust.tools.fuzz import gen as fuzz_gen
from onnx import numpy_helper

# 3000: with the ops group in `all` (fifteenth session) 600 graphs missed two rare facts
# (ReduceL2 without axes appears first near graph 2000); 3000 hold each fact 5+ times, 4 s
CASES = 3000


def _facts(b: fuzz_build.Builder) -> set[str]:
    """What one built graph contains, as short tags (see COVERAGE)."""
    inits = {t.name: numpy_helper.to_array(t) for t in b.inits}
    shape = {**{k: v.shape for k, v in inits.items()}, **{k: v.shape for k, v in b.vals.items()}}
    value = {**inits, **b.feeds}
    facts = {f"opset{b.opset}"}
    for x in b.feeds.values():
        facts.add(f"input {x.dtype}")
        if 0 in x.shape:
            facts.add("zero-size input")
        if x.dtype.kind == "f" and x.size:
            finite = np.abs(x[np.isfinite(x)].astype(np.float64))
            facts |= {tag for tag, hit in (
                ("1e20", (finite >= 1e19).any()), ("inf", np.isinf(x).any()),
                ("nan", np.isnan(x).any()),
                ("denormal", ((finite > 0) & (finite < np.finfo(x.dtype).tiny)).any())) if hit}
    for n in b.nodes:
        facts |= _node_facts(n, shape, value, b)
    return facts


def _node_facts(n: onnx.NodeProto, shape: dict, value: dict, b: fuzz_build.Builder) -> set:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
    ins = [shape.get(i, ()) for i in n.input]
    out = shape.get(n.output[0], ())
    facts = {n.op_type}
    for rule in (_shape_facts, _index_facts, _numeric_facts, _optional_facts):
        facts |= rule(n, attrs, ins, out, value, b)
    return facts


def _shape_facts(n, attrs, ins, out, value, b) -> set:
    facts = set()
    if n.op_type == "Slice" and 0 in out and 0 not in ins[0]:
        facts.add("Slice makes zero-size")
    if n.op_type == "Reshape" and 0 in ins[0]:
        facts.add("Reshape of zero-size" + (" allowzero" if attrs.get("allowzero") else ""))
    if n.op_type.startswith("Reduce") and attrs.get("noop_with_empty_axes"):
        axes = value.get(n.input[1]) if len(n.input) > 1 else None
        if axes is None or not axes.size:
            facts.add(f"{n.op_type} noop without axes")
            facts.add("noop " + ("absent axes" if axes is None else "empty axes"))
    if n.op_type == "Pad":
        facts.add(f"Pad {attrs.get('mode', b'constant').decode()}")
        if 0 in ins[0]:
            facts.add("Pad of zero-size")
    if n.op_type == "CumSum" and attrs.get("exclusive") and attrs.get("reverse"):
        facts.add("CumSum exclusive reverse")
        if 0 in ins[0]:
            facts.add("CumSum exclusive on empty")
    if n.op_type == "MatMul" and ins[0] and ins[1]:
        facts |= {tag for tag, hit in (("MatMul K=0", ins[0][-1] == 0),
                                        ("MatMul M=0", len(ins[0]) > 1 and ins[0][-2] == 0),
                                        ("MatMul batch 0", 0 in ins[0][:-2])) if hit}
    return facts


def _index_facts(n, attrs, ins, out, value, b) -> set:
    facts = set()
    if n.op_type == "GatherElements":
        axis = attrs.get("axis", 0) % len(ins[0])
        if any(i != axis and ins[1][i] < ins[0][i] for i in range(len(ins[0]))):
            facts.add("GatherElements indices smaller than data")
    gather = n.op_type in ("Gather", "GatherElements")
    if gather and n.input[1] in value and (value[n.input[1]] < 0).any():
        facts.add("negative indices")
    if n.op_type == "Gather" and n.input[0] in value and len(ins[0]) == 2 and len(ins[1]) == 2:
        facts.add("embedding lookup")
    if n.op_type == "Softmax" and any(m.op_type == "Where" and m.output[0] == n.input[0]
                                      for m in b.nodes):
        facts.add("Softmax over a Where mask")
    return facts


def _optional_facts(n, attrs, ins, out, value, b) -> set:
    """The classes issue 24 found (tools/fuzz/gen_optional.py)."""
    facts = set()
    given = [i for i in n.input[1:3]] + [""] * (2 - len(n.input[1:3]))
    if n.op_type == "Clip":
        facts.add("Clip " + {(True, True): "both bounds", (True, False): "min only",
                             (False, True): "max only", (False, False): "no bounds"}[
            (bool(given[0]), bool(given[1]))])
    if n.op_type == "Gemm":
        facts |= {f"Gemm {k} 0" for k in ("alpha", "beta") if attrs.get(k, 1.0) == 0}
        c = value.get(n.input[2]) if len(n.input) > 2 else None
        if attrs.get("beta", 1.0) == 0 and c is not None and not np.isfinite(c).all():
            facts.add("Gemm beta 0 with C holding inf/NaN")
    x = value.get(n.input[0]) if n.input else None
    if n.op_type == "CumSum" and x is not None and np.signbit(x[x == 0]).any():
        facts.add("CumSum of -0.0")
    if n.op_type == "GatherElements":
        axis = attrs.get("axis", 0) % len(ins[0])
        if any(i != axis and ins[1][i] > ins[0][i] for i in range(len(ins[0]))):
            facts.add("GatherElements indices longer than data")
    if n.op_type == "Expand" and n.input[1] in value and (
            (value[n.input[1]] < 0).any() or np.prod(value[n.input[1]], dtype=float) > 2 ** 40):
        facts.add("Expand to an absurd shape")
    if n.op_type.startswith("Reduce") and any(m.op_type == "CumSum" and m.output[0] ==
                                              n.input[0] for m in b.nodes):
        facts.add("CumSum into a reduction")
    return facts


ROUNDING = ("Floor", "Ceil", "Round", "Greater", "Less", "Equal", "ArgMax")
TO_INT = (onnx.TensorProto.INT32, onnx.TensorProto.INT64)


def _numeric_facts(n, attrs, ins, out, value, b) -> set:
    facts = set()
    produced = b.vals.get(n.output[0])
    if n.op_type in ("Div", "Mod") and produced is not None and produced.dtype.kind == "i":
        facts.add(f"int {n.op_type}")
        d = value.get(n.input[1])
        if d is not None and (d == 0).any():
            facts.add(f"int {n.op_type} by zero")
    f16_in = n.input and n.input[0] in b.vals and b.vals[n.input[0]].dtype == np.float16
    to_int = n.op_type == "Cast" and attrs["to"] in TO_INT
    if f16_in and (n.op_type in ROUNDING or to_int):
        facts.add("float16 into a rounding-sensitive op")
    return facts


COVERAGE = [
    "opset13", "opset17", "opset21", "input float16", "input int32", "input int64",
    "zero-size input", "Slice makes zero-size", "Reshape of zero-size",
    "Reshape of zero-size allowzero",
    "1e20", "denormal", "inf", "nan", "float16 into a rounding-sensitive op",
    *[f"{op} noop without axes" for op in ("ReduceSum", "ReduceL1", "ReduceL2", "ReduceLogSum",
                                           "ReduceSumSquare", "ReduceMax", "ReduceMean")],
    "noop absent axes", "noop empty axes", "ReduceProd", "ReduceMin", "ReduceLogSumExp",
    "ArgMin",
    "GatherElements indices smaller than data", "negative indices",
    "Pad constant", "Pad reflect", "Pad edge", "Pad wrap", "Pad of zero-size",
    "CumSum exclusive reverse", "CumSum exclusive on empty",
    "MatMul K=0", "MatMul M=0", "MatMul batch 0",
    "int Div", "int Mod", "int Div by zero", "int Mod by zero",
    "embedding lookup", "Split", "Tile", "Range", "Trilu", "GroupNormalization", "Where",
    "LayerNormalization", "Softmax over a Where mask", "Flatten", "TopK", "NonZero",
    "Clip min only", "Clip max only", "Clip no bounds", "Gemm alpha 0", "Gemm beta 0",
    "Gemm beta 0 with C holding inf/NaN", "CumSum of -0.0", "CumSum into a reduction",
    "GatherElements indices longer than data", "Expand to an absurd shape",
]


def test_generator_covers_every_edge_case():
    seen = collections.Counter()
    for i in range(CASES):
        seen.update(_facts(fuzz_gen.build(np.random.default_rng([3, i]))))
    missing = [f for f in COVERAGE if not seen[f]]
    assert not missing, missing


@pytest.mark.parametrize("preset", sorted(fuzz_gen.PRESETS))
def test_generated_graphs_are_valid_and_shapes_are_exact(preset):
    features = fuzz_gen.PRESETS[preset]
    for i in range(40):
        case = fuzz_gen.case_for(11, i, features)
        onnx.checker.check_model(case.model, full_check=True)
        sess = fuzz_check.ort_session(case.model)  # loads: a valid graph
        try:
            outs = sess.run(None, case.feeds)
        except Exception:  # noqa: BLE001 - only error profiles may make onnxruntime raise
            assert case.profile.errors, f"case {i} raised without an error profile"
            continue
        for vi, out in zip(case.model.graph.output, outs):
            if vi.name in case.shapes:
                assert out.shape == case.shapes[vi.name], (i, vi.name)


def test_classic_profile_is_float32_normal_and_nonempty():
    for i in range(60):
        case = fuzz_gen.case_for(2, i, fuzz_gen.CLASSIC)
        assert case.profile.regime == "normal" and not case.profile.empty
        for x in case.feeds.values():
            assert x.dtype != np.float16 and 0 not in x.shape
            assert x.dtype.kind != "f" or np.isfinite(x).all()


def test_generator_is_deterministic():
    a, b = fuzz_gen.case_for(4, 17), fuzz_gen.case_for(4, 17)
    assert a.model.SerializeToString() == b.model.SerializeToString()
    assert a.feeds.keys() == b.feeds.keys()
    for k in a.feeds:
        np.testing.assert_array_equal(a.feeds[k], b.feeds[k])


def test_features_from_presets_and_lists():
    assert fuzz_gen.features_from("all") == fuzz_gen.ALL
    assert fuzz_gen.features_from("classic,f16") == {"core", "f16"}
    with pytest.raises(ValueError, match="unknown fuzz feature"):
        fuzz_gen.features_from("core,nope")


@pytest.mark.parametrize("axes, want", [("0,2,3", (0,)), ("0,-2,-1", (0, 3, 2))])
def test_onnxruntime_reduces_empty_tensors_like_the_spec_with_positive_axes(axes, want):
    # onnxruntime 1.31.1 reduces a zero-size tensor as the spec (and our reference) do when
    # the axes are non-negative, but ignores negative axes then (the spec says (0,)). The
    # generator gives empty inputs non-negative axes only; if the second row fails after an
    # onnxruntime upgrade, let _reduce_axes (tools/fuzz/gen_edge.py) negate them again.
    model = onnx.parser.parse_model(
        '<ir_version: 10, opset_import: ["" : 18]> g (float[3,0,3,2] x) => (float[?] y) '
        f'{{ a = Constant <value = int64[3] {{{axes}}}> () y = ReduceMean <keepdims = 0> (x, a) }}')
    (got,) = fuzz_check.run_ort(model, {"x": np.zeros((3, 0, 3, 2), np.float32)})
    assert got.shape == want
