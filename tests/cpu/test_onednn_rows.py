"""oneDNN matmuls over stacks of rows (backends/cpu/onednn.rows_merged): [1, 7, 7, K] x
[K, N] runs as one [49, K] x [K, N] GEMM where the strides allow, post-op operands
reshaped with it; against NumPy in float64."""

from __future__ import annotations

import numpy as np
import pytest
from autoclust.backends.cpu import onednn
from autoclust.backends.cpu.onednn import Operand, rows_merged

RNG = np.random.default_rng(7)


def test_a_stack_of_rows_becomes_one_gemm():
    a, b, y = Operand((1, 7, 7, 64)), Operand((64, 32)), Operand((1, 7, 7, 32))
    post = [("add", (32,)), ("add", (1, 7, 7, 32)), ("gelu_erf", ()), ("mul", (7, 1, 32))]
    got = rows_merged(a, b, y, post[:3])
    assert (got[0].shape, got[0].strides) == ((49, 64), (64, 1))
    assert (got[1].shape, got[2].shape) == ((64, 32), (49, 32))
    assert [s[1] for s in got[3]] == [(1, 32), (49, 32), ()]
    # an operand broadcast over some of the rows' dims, a batch of b's, rows that do not
    # lie at one stride (a slice of a wider buffer's rows): left as they are
    assert rows_merged(a, b, y, post)[0] is a
    assert rows_merged(a, Operand((2, 64, 32)), Operand((2, 7, 7, 32)), ())[0] is a
    wide = Operand((1, 7, 7, 64), (7 * 8 * 64, 8 * 64, 64, 1))
    assert rows_merged(wide, b, y, ())[0] is wide
    # a row stride that is not K (rows of a wider buffer, at one stride) still merges
    rows = Operand((1, 7, 7, 64), (49 * 96, 7 * 96, 96, 1))
    assert rows_merged(rows, b, y, ())[0].strides == (96, 1)


@pytest.mark.skipif(bool(onednn.unavailable()), reason=f"oneDNN: {onednn.unavailable()}")
@pytest.mark.parametrize("lead", [(1, 7, 7), (2, 3, 5), (4, 1, 9)])
def test_stacked_rows_with_post_ops_match_numpy(lead):
    k, n = 48, 40
    x = RNG.standard_normal(lead + (k,)).astype(np.float32)
    w = RNG.standard_normal((k, n)).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32)
    res = RNG.standard_normal(lead + (n,)).astype(np.float32)
    y = np.empty(lead + (n,), np.float32)
    mm = onednn.Matmul(Operand(x.shape), Operand(w.shape), Operand(y.shape), 0.5,
                       [("add", (n,)), ("add", lead + (n,))], weights=w, threads=2)
    mm([x, y, bias, res])
    want = 0.5 * (x.astype(np.float64) @ w) + bias + res
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5)
