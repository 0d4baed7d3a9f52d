"""Every op's lowering, compiled and checked against onnxruntime.

One table, CASES, holds at least one case per op that has a `lower` in the op table (a test
asserts that, so an op added without a case fails here). Each case is a one-node graph
lowered with autoclust.compile.lower_graph (no graph optimizations: the op's own lowering
runs), compiled by the CPU backend and compared with onnxruntime; the node must end up in a
compiled kernel (`Kernel.nodes`), never anywhere else.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.compiled import check_compiled, one_node_graph
from support.lowering_cases import (
    CASES,
    NO_COMPILABLE_DTYPE,
)

from autoclust import ops
from autoclust.kernel import ir as kir

F32, I64 = np.float32, np.int64










def _params():
    for op, cases in sorted(CASES.items()):
        for k, case in enumerate(cases):
            yield pytest.param(op, case, id=f"{op}-{k}")


@pytest.mark.parametrize("op,case", list(_params()))
def test_lowered_op_matches_onnxruntime(op, case):
    inputs, attrs, const_inputs, n_outputs = case
    g = one_node_graph(op, inputs, attrs, const_inputs=const_inputs, n_outputs=n_outputs)
    feeds = [v for i, v in enumerate(inputs) if v is not None and i not in const_inputs]
    exe = check_compiled(g, feeds, rtol=2e-5, atol=2e-6)
    node = g.nodes[0].name
    kernels = [t for t in exe.program.thunks if isinstance(t, kir.Kernel)]
    assert any(node in k.nodes for k in kernels), kir.format_program(exe.program)
    assert all(isinstance(t, (kir.Kernel, kir.Check)) for t in exe.program.thunks)


def test_every_lowered_op_has_a_case():
    lowered = {d.op for d in ops.all_ops() if d.lower is not None and not d.domain}
    assert lowered - set(CASES) == set(NO_COMPILABLE_DTYPE)
    for op in NO_COMPILABLE_DTYPE:
        assert not ops.get(op).compiled_dtypes


def test_every_fusible_op_lowers_or_says_why():
    for d in ops.all_ops():
        if d.kind == ops.LIBRARY:
            continue
        assert d.lower is not None or d.refuse, f"{d.op}: no lowering and no reason"
