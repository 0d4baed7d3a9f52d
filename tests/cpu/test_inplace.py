"""Kernels writing their output over an input they read last (backends/cpu/inplace.py,
kernel/memplan.py): which do, against onnxruntime, and which must not.

Each model puts a temp (a MatMul's product) in front of the kernel under test, so the
kernel's input has a memory-plan slot its output may take. A kernel that shares it wrongly
computes from values it has already overwritten: the outputs are compared with
onnxruntime's, on rows holding NaN, inf and -0.0 too.
"""

from __future__ import annotations

import numpy as np
import pytest
from autoclust.backends import cpu
from autoclust.backends.cpu import inplace
from support.chains import compile_model, model_from_text
from support.speed import ort_session

from autoclust.kernel import ir as kir

RNG = np.random.default_rng(7)
HEAD = '<ir_version: 10, opset_import: ["" : 18]>'


def product_then(body: str, out: str = "float[8,40] y", extra: str = "") -> str:
    """x [8, 24] @ w [24, 40] -> t (a temp), then `body` over t."""
    return f"""{HEAD}
        m (float[8,24] x, float[24,40] w{extra}) => ({out})
        {{
            t = MatMul(x, w)
            {body}
        }}"""


def feeds(extra: dict | None = None) -> dict:
    x = RNG.standard_normal((8, 24)).astype(np.float32)
    x[1, 3], x[2, 5], x[3, 0] = np.nan, np.inf, -np.inf  # rows of NaN / inf products
    w = (RNG.standard_normal((24, 40)) / 5).astype(np.float32)
    return {"x": x, "w": w, **(extra or {})}


def compiled(text: str, inputs: dict):
    """(executable, {buffer name: slot}, outputs), the outputs checked against
    onnxruntime (NaN where it has NaN)."""
    model = model_from_text(text)
    exe, args = compile_model(model, inputs)
    got = exe.run(args)
    want = ort_session(model, 1).run(None, inputs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6, equal_nan=True,
                                   err_msg=exe.dumps[".kernels.txt"])
    return exe, {b.name: b.slot for b in exe.program.buffers}, got


@pytest.mark.parametrize("body", [
    "y = Softmax<axis = 1>(t)",                            # phases, exp stashed into y
    "y = LogSoftmax<axis = 1>(t)",
    "s = Softmax<axis = 1>(t)\n y = Mul(s, s)",             # exp stashed, the store reads it
    "y = Softmax<axis = 0>(t)",                             # rows along the outer dim
])
def test_kernel_writes_over_the_product(body):
    _, slots, _ = compiled(product_then(body.replace("y =", "u =") + "\n v = MatMul(u, w2)",
                                        "float[8,8] v", ", float[40,8] w2"),
                           feeds({"w2": RNG.standard_normal((40, 8)).astype(np.float32)}))
    assert slots["u"] == slots["t"] >= 0


def test_layer_norm_writes_over_the_product():
    text = product_then("n = LayerNormalization<axis = -1>(t, s, b)\n v = MatMul(n, w2)",
                        "float[8,8] v", ", float[40] s, float[40] b, float[40,8] w2")
    _, slots, _ = compiled(text, feeds({"s": RNG.standard_normal(40).astype(np.float32),
                                        "b": RNG.standard_normal(40).astype(np.float32),
                                        "w2": RNG.standard_normal((40, 8)).astype(np.float32)}))
    assert slots["n"] == slots["t"] >= 0


@pytest.mark.parametrize("case", ["transpose", "after the stash", "read later"])
def test_kernel_keeps_an_input_it_must_not_overwrite(case):
    w2 = RNG.standard_normal((40, 8)).astype(np.float32)
    if case == "transpose":  # reads t[j, i] while writing u[i, j] (a kernel of its own:
        # a transpose read by the GEMM alone would be its flag, simplify._matmul_of_transpose)
        text = f"""{HEAD}
            m (float[40,40] x, float[40,5] w3) => (float[40,5] v)
            {{
                t = Softmax<axis = 1>(x)
                d = Transpose<perm = [1, 0]>(t)
                u = Add(d, x)
                v = MatMul(u, w3)
            }}"""
        inputs = {"x": RNG.standard_normal((40, 40)).astype(np.float32) * 3,
                  "w3": RNG.standard_normal((40, 5)).astype(np.float32)}
    elif case == "after the stash":  # the store reads t after exp went into the row
        text = product_then("e = Softmax<axis = 1>(t)\n u = Mul(e, t)\n v = MatMul(u, w2)",
                            "float[8,8] v", ", float[40,8] w2")
        inputs = feeds({"w2": w2})
    else:  # t is read again after the kernel (its last reader is the second MatMul)
        text = product_then("u = Softmax<axis = 1>(t)\n v = MatMul(u, w2)\n k = MatMul(t, w2)",
                            "float[8,8] v, float[8,8] k", ", float[40,8] w2")
        inputs = feeds({"w2": w2})
    exe, slots, _ = compiled(text, inputs)
    assert slots["u"] != slots["t"], exe.dumps[".kernels.txt"]


def test_writes_over_rules_on_kernels():
    """The predicate itself: one store at the loads' index; not a second store, not a
    broadcast read, not a different dtype."""
    def buf(i, dtype="float32", shape=(4, 8)):
        return kir.Buffer(i, f"b{i}", dtype, shape, "temp")
    same = kir.Affine(0, (8, 1))
    load = kir.Load(0, same, "float32")
    tanh = kir.Op("tanh", (load,), "float32")
    one = kir.Kernel("k", (4, 8), 0, (), (kir.Store(1, same, tanh),))
    assert inplace.writes_over(one, buf(0), buf(1))
    assert not inplace.writes_over(one, buf(0), buf(1, "int32"))
    two = kir.Kernel("k", (4, 8), 0, (), (kir.Store(1, same, tanh), kir.Store(2, same, load)))
    assert not inplace.writes_over(two, buf(0), buf(1))
    row = kir.Load(0, kir.Affine(0, (0, 1)), "float32")  # the same row for every i0
    bcast = kir.Kernel("k", (4, 8), 0, (), (kir.Store(1, same, kir.Op("tanh", (row,),
                                                                         "float32")),))
    assert not inplace.writes_over(bcast, buf(0, shape=(1, 8)), buf(1))


def test_the_cpu_policy_writes_over():
    assert cpu.POLICY.writes_over is inplace.writes_over
