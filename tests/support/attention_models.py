"""Attention in the shapes exporters write (hand-written ONNX) and feeds for it, with rows
fully masked on demand: shared by the GPU (tests/gpu/test_gpu_attention.py) and CPU
(tests/cpu/test_cpu_attention.py) tests of FusedAttention."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper

from autoclust.ops import attention as attn

BF16 = np.dtype(ml_dtypes.bfloat16)
ONNX_TYPE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
             "bfloat16": TensorProto.BFLOAT16}


def _model(nodes, inputs, outputs, inits=(), opset=17):
    m = helper.make_model(helper.make_graph(nodes, "attention", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset),
                                         helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m


def _info(name, dtype, shape):
    return helper.make_tensor_value_info(name, ONNX_TYPE.get(dtype, dtype), shape)


def _const(name, value, dtype="float32"):
    arr = np.asarray(value, dtype=BF16 if dtype == "bfloat16" else dtype)
    return onnx.numpy_helper.from_array(arr, name)


def bert_like(b, s, h, d, dtype="float32"):
    """q, k, v [B, S, H, D] -> heads by Transpose, K by perm (0, 2, 3, 1), Div by sqrt(D),
    an additive mask [B, 1, 1, S] -> Softmax -> MatMul -> merge heads."""
    nodes = [helper.make_node("Transpose", ["q"], ["qh"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("Transpose", ["v"], ["vh"], perm=[0, 2, 1, 3]),
             helper.make_node("MatMul", ["qh", "kt"], ["s0"]),
             helper.make_node("Div", ["s0", "c"], ["s1"]),
             helper.make_node("Add", ["s1", "mask"], ["s2"]),
             helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "vh"], ["o"]),
             helper.make_node("Transpose", ["o"], ["y"], perm=[0, 2, 1, 3])]
    ins = [_info(n, dtype, [b, s, h, d]) for n in "qkv"] + [_info("mask", dtype, [b, 1, 1, s])]
    return _model(nodes, ins, [_info("y", dtype, [b, s, h, d])], [_const("c", d ** 0.5, dtype)])


def projected(b, s, h, d, seed=0):
    """ViT's and BERT's attention with its projections: x [B, S, H*D] times three constant
    weights plus biases (one GEMM after passes/siblings.py, Q, K and V Slices of it), head
    split by Reshape and Transpose, Div by sqrt(D), an additive mask, merged heads."""
    rng = np.random.default_rng(seed)
    e = h * d
    nodes, inits = [], [_const("c", d ** 0.5), _const("heads", [b, s, h, d], "int64"),
                        _const("merged", [b, s, e], "int64")]
    for n, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        inits += [_const(f"w{n}", rng.standard_normal((e, e)) / np.sqrt(e)),
                  _const(f"b{n}", rng.standard_normal(e))]
        nodes += [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}0"]),
                  helper.make_node("Add", [f"{n}0", f"b{n}"], [f"{n}1"]),
                  helper.make_node("Reshape", [f"{n}1", "heads"], [f"{n}2"]),
                  helper.make_node("Transpose", [f"{n}2"], [f"{n}h"], perm=perm)]
    nodes += [helper.make_node("MatMul", ["qh", "kh"], ["s0"]),
              helper.make_node("Div", ["s0", "c"], ["s1"]),
              helper.make_node("Add", ["s1", "mask"], ["s2"]),
              helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vh"], ["o"]),
              helper.make_node("Transpose", ["o"], ["o2"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["o2", "merged"], ["y"])]
    ins = [_info("x", "float32", [b, s, e]), _info("mask", "float32", [b, 1, 1, s])]
    return _model(nodes, ins, [_info("y", "float32", [b, s, e])], inits)


def dynamo_like(b, h, hkv, sq, sk, d, dv, dtype="float32", mask=True, guard=True):
    """torch.onnx.export(dynamo=True)'s scaled_dot_product_attention: q and k scaled by
    D^-1/4 each, K transposed as Reshape/Transpose/Reshape, GQA heads by Unsqueeze/Expand/
    Reshape, an additive mask [B, 1, Sq, Sk], Softmax, the IsNaN guard, MatMul."""
    rep = h // hkv
    nodes, inits = [], [_const("c", d ** -0.25, dtype), _const("zero", 0.0, dtype)]
    for name, width in (("k", d), ("v", dv)):
        if rep > 1:
            inits += [_const(f"{name}_ax", [2], "int64"),
                      _const(f"{name}_rep", [b, hkv, rep, sk, width], "int64"),
                      _const(f"{name}_flat", [b, h, sk, width], "int64")]
            nodes += [helper.make_node("Unsqueeze", [name, f"{name}_ax"], [f"{name}_u"]),
                      helper.make_node("Expand", [f"{name}_u", f"{name}_rep"], [f"{name}_e"]),
                      helper.make_node("Reshape", [f"{name}_e", f"{name}_flat"],
                                       [f"{name}_h"])]
        else:
            nodes.append(helper.make_node("Identity", [name], [f"{name}_h"]))
    inits += [_const("s3", [b * h, sk, d], "int64"), _const("s4", [b, h, d, sk], "int64")]
    nodes += [helper.make_node("Reshape", ["k_h", "s3"], ["k3"]),
              helper.make_node("Transpose", ["k3"], ["k3t"], perm=[0, 2, 1]),
              helper.make_node("Reshape", ["k3t", "s4"], ["kt"]),
              helper.make_node("Mul", ["q", "c"], ["qs"]),
              helper.make_node("Mul", ["kt", "c"], ["ks"]),
              helper.make_node("MatMul", ["qs", "ks"], ["s0"])]
    ins = [_info("q", dtype, [b, h, sq, d]), _info("k", dtype, [b, hkv, sk, d]),
           _info("v", dtype, [b, hkv, sk, dv])]
    last = "s0"
    if mask:
        nodes.append(helper.make_node("Add", ["s0", "mask"], ["s1"]))
        ins.append(_info("mask", dtype, [b, 1, sq, sk]))
        last = "s1"
    nodes.append(helper.make_node("Softmax", [last], ["p"], axis=-1))
    if guard:
        nodes += [helper.make_node("IsNaN", ["p"], ["nan"]),
                  helper.make_node("Where", ["nan", "zero", "p"], ["pg"])]
    nodes.append(helper.make_node("MatMul", ["pg" if guard else "p", "v_h"], ["y"]))
    return _model(nodes, ins, [_info("y", dtype, [b, h, sq, dv])], inits)


def select_like(b, h, sq, sk, d, dtype="float32", fill=-np.inf, causal=None):
    """LLaMA's eager form: MatMul(q, Transpose(k)) * scale, Where(mask, S, fill): the mask
    a bool input [B, 1, Sq, Sk], or (causal = offset) a constant lower triangle."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]),
             helper.make_node("Mul", ["s0", "c"], ["s1"]),
             helper.make_node("Where", ["mask", "s1", "fill"], ["s2"]),
             helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    ins = [_info("q", dtype, [b, h, sq, d]), _info("k", dtype, [b, h, sk, d]),
           _info("v", dtype, [b, h, sk, d])]
    inits = [_const("c", d ** -0.5, dtype), _const("fill", fill, dtype)]
    if causal is None:
        ins.append(_info("mask", TensorProto.BOOL, [b, 1, sq, sk]))
    else:
        tri = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + causal
        inits.append(onnx.numpy_helper.from_array(tri, "mask"))
    return _model(nodes, ins, [_info("y", dtype, [b, h, sq, d])], inits)


def _feeds(model, seed=0, masked_rows=(), bool_mask_p=0.7):
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in model.graph.input:
        t = i.type.tensor_type
        shape = [dd.dim_value for dd in t.shape.dim]
        if i.name == "mask" and t.elem_type == TensorProto.BOOL:
            m = rng.random(shape) < bool_mask_p
            m[..., :, 0] = True
            for r in masked_rows:
                m[..., r, :] = False
            feeds[i.name] = m
        elif i.name == "mask":
            m = np.where(rng.random(shape) < 0.75, 0.0, -np.inf)
            m[..., 0] = 0.0
            for r in masked_rows:
                m[..., r, :] = -np.inf
            feeds[i.name] = m.astype(_np_dtype(t.elem_type))
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(_np_dtype(t.elem_type))
    return feeds


def _np_dtype(elem_type):
    return BF16 if elem_type == TensorProto.BFLOAT16 else \
        helper.tensor_dtype_to_np_dtype(elem_type)


def torch_like(b, h, sq, sk, d, mask=True, zeros_op=True):
    """torch 2.13's decomposition through the torch front end: bmm over [B*H] heads,
    scaled, viewed [B, H, Sq, Sk], an additive mask, Softmax, and the guard that zeroes
    rows whose every score is -inf, Where(Not(any(S != -inf)), 0, P) -- a second reader of
    the scores -- then bmm with V. Its zeros: a ConstantOfShape, as torch's full_like
    (`zeros_op`), or an initializer."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]),
             helper.make_node("Mul", ["s0", "c"], ["s1"]),
             helper.make_node("Reshape", ["s1", "s4d"], ["s2"])]
    ins = [_info("q", "float32", [b * h, sq, d]), _info("k", "float32", [b * h, sk, d]),
           _info("v", "float32", [b * h, sk, d])]
    inits = [_const("c", d ** -0.5), _const("s4d", [b, h, sq, sk], "int64"),
             _const("s3d", [b * h, sq, sk], "int64"), _const("ninf", -np.inf),
             _const("axis", [-1], "int64")]
    if zeros_op:
        nodes.append(helper.make_node("ConstantOfShape", ["s4d"], ["zeros"],
                                      value=_const("fill", [0.0])))
    else:
        inits.append(_const("zeros", np.zeros((b, h, sq, sk))))
    last = "s2"
    if mask:
        nodes.append(helper.make_node("Add", ["s2", "mask"], ["s3"]))
        ins.append(_info("mask", "float32", [b, 1, sq, sk]))
        last = "s3"
    nodes += [helper.make_node("Softmax", [last], ["p"], axis=-1),
              helper.make_node("Equal", [last, "ninf"], ["eq"]),
              helper.make_node("Not", ["eq"], ["ne"]),
              helper.make_node("Cast", ["ne"], ["ne_i"], to=TensorProto.INT32),
              helper.make_node("ReduceMax", ["ne_i", "axis"], ["any_i"], keepdims=1),
              helper.make_node("Cast", ["any_i"], ["any"], to=TensorProto.BOOL),
              helper.make_node("Not", ["any"], ["none"]),
              helper.make_node("Where", ["none", "zeros", "p"], ["pg"]),
              helper.make_node("Reshape", ["pg", "s3d"], ["p3"]),
              helper.make_node("MatMul", ["p3", "v"], ["y"])]
    return _model(nodes, ins, [_info("y", "float32", [b * h, sq, d])], inits, opset=18)


def fused_calls(sess) -> list:
    """The FusedAttention library calls in a session's compiled clusters."""
    return [t for r in sess._runtime.compiled_clusters() for exe in r.cache.values()
            for t in exe.program.thunks if getattr(t, "op", "") == attn.OP]
