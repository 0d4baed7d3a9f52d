"""How each kernel runs on the GPU: a strategy, threads per block, index width, vector width.

    elementwise   grid-stride loop, one element per thread step
    vector        grid-stride loop over V consecutive elements: 128-bit loads and stores of
                  the contiguous operands (a runtime alignment check falls back to scalar)
    thread-row    one thread per row (very short rows, or rows strided in memory whose
                  neighbours are contiguous: threads of a warp then read adjacent elements)
    warp-row      one warp per row: lanes stride the row, then a shuffle butterfly
    block-row     one block per row (long rows, or few rows): lanes stride the row, warp
                  shuffles, then shared memory across the warps
    split-row     few very long rows (split.py): one block per CHUNK-element chunk of a row
                  writes a partial; the block that finishes a row last combines its
                  partials in chunk order and stores. Only kernels whose phases are
                  independent and whose stores are all per row (Reduce*, ArgMax/ArgMin and
                  epilogues of the reduced values): Softmax, LayerNorm, ReduceLogSumExp
                  (a phase reads an earlier phase's full-row result) stay block-row
    scan          one thread per row, a running sum/product (CumSum, float Range)

Every loop is grid-stride, so any grid size is correct; the executable sizes the grid from
the work and the device's multiprocessor count. Index math is 32-bit when every loop index
and every affine offset the kernel can form stays below 2^31.
"""

from __future__ import annotations

import dataclasses
import math

from autoclust.kernel import ir as kir

BLOCK = 256           # threads per block, except block-row kernels
WARP = 32
SHORT_ROW = 4         # rows up to this long run one thread per row
LONG_ROW = 2048       # rows from this long run one block per row
FEW_ROWS = 1024       # ... and so do rows longer than a warp's sweet spot when rows are few
# split-row: a fixed chunk, not a split count from the SM count, so the partial count is
# known when rendering (scratch sized once per signature) and a row's sum is added in the
# same order on every GPU. 16K elements is 32 per thread of a 512-thread block: enough to
# amortize the block's combine and atomic; a [1, 4M] row still makes 256 blocks (~2 per
# SM of an H100).
SPLIT_CHUNK = 16384
SPLIT_BLOCK = 512
SPLIT_ROW = 65536     # rows from this long split (>= 4 chunks; shorter ones stream in one
                      # block in about a launch's time, so splitting them saves little)
FILL_ROWS = 256       # ... when fewer rows than this: 256+ block-row blocks already put two
                      # 1024-thread blocks on each of an H100's 132 SMs
MAX_VECTOR = 8        # elements per thread step on the vector path
BLOCKS_PER_SM = 32    # grid cap: enough blocks in flight to hide latency, then grid-stride


@dataclasses.dataclass(frozen=True)
class Launch:
    strategy: str
    block: int            # threads per block
    unit: int             # work items per unit of the outer loop extent n0
    per_block: int        # work items one block takes per grid-stride step
    lanes: int = 1        # threads cooperating on one row (row kernels)
    vector: int = 1       # elements per work item (vector kernels)
    wide: bool = False    # 64-bit index math
    chunk: int = 0        # split-row: elements of a row per block
    chunks: int = 1       # split-row: chunks per row (work items per row)

    def items(self, n0: int) -> int:
        """Work items of a run with outer extent n0 (elements, vectors, rows or chunks)."""
        return -(-n0 * self.unit * self.chunks // self.vector)

    def grid(self, n0: int, sm_count: int) -> int:
        """Blocks to launch: enough for the work, capped at BLOCKS_PER_SM per SM."""
        need = -(-self.items(n0) // self.per_block)
        return max(1, min(need, BLOCKS_PER_SM * max(sm_count, 1)))

    def describe(self) -> str:
        bits = "64-bit" if self.wide else "32-bit"
        what = {
            "elementwise": "grid-stride, one element per thread",
            "vector": f"grid-stride, {self.vector} elements per thread (vector loads/stores "
                      "where aligned)",
            "thread-row": "one thread per row",
            "warp-row": "one warp per row, shuffle reduction",
            "block-row": f"one block of {self.block} per row, shuffles + shared memory",
            "scan": "one thread per row, sequential scan",
            "split-row": f"{self.chunks} chunk(s) of {self.chunk} per row, a block of "
                         f"{self.block} per chunk; the last block of a row combines the "
                         "partials in chunk order",
        }[self.strategy]
        return f"{self.strategy}: {what}; block {self.block}; {bits} indices"


def prod(xs) -> int:
    return math.prod(xs) if xs else 1


def choose(k: kir.Kernel, n0_max: int) -> Launch:
    """The launch of kernel k when its outer extent is at most n0_max."""
    n_outer = len(k.shape) - k.n_inner
    unit = prod(k.shape[1:n_outer]) if n_outer else 1
    inner = prod(k.shape[n_outer:])
    wide = needs_wide(k, n0_max)
    if k.scan:
        return Launch("scan", BLOCK, unit, BLOCK, wide=wide)
    if not k.reductions and k.n_inner == 0:
        v = vector_width(k)
        if v > 1:
            return Launch("vector", BLOCK, unit, BLOCK, vector=v, wide=wide)
        return Launch("elementwise", BLOCK, unit, BLOCK, wide=wide)
    rows = n0_max * unit
    if inner <= SHORT_ROW or (_coalesced_across_rows(k) and rows >= 8 * FEW_ROWS):
        return Launch("thread-row", BLOCK, unit, BLOCK, wide=wide)
    if inner >= SPLIT_ROW and rows < FILL_ROWS and splittable(k):
        return split_launch(inner, unit, SPLIT_CHUNK, wide)
    if inner >= LONG_ROW or (inner > 8 * WARP and rows < FEW_ROWS):
        block = 256 if inner <= 8192 else 512 if inner <= 32768 else 1024
        return Launch("block-row", block, unit, 1, lanes=block, wide=wide)
    return Launch("warp-row", BLOCK, unit, BLOCK // WARP, lanes=WARP, wide=wide)


def split_launch(inner: int, unit: int, chunk: int, wide: bool) -> Launch:
    """The split-row launch of rows of `inner` elements cut into chunks of `chunk`."""
    chunks = max(1, -(-inner // chunk))  # an empty row still has one (empty) chunk
    return Launch("split-row", SPLIT_BLOCK, unit, 1, lanes=SPLIT_BLOCK, wide=wide,
                  chunk=chunk, chunks=chunks)


def splittable(k: kir.Kernel) -> bool:
    """Whether split-row computes k in one launch: no phase reads another phase's result
    (every phase can be split into chunks) and every store is per row (nothing is written
    per element, which would need the full-row results everywhere)."""
    if not k.reductions or k.scan or not k.n_inner:
        return False
    if any(isinstance(e, kir.Reduced) for e in kir.walk([r.expr for r in k.reductions])):
        return False
    return all(s.per_row for s in k.stores)


def _coalesced_across_rows(k: kir.Kernel) -> bool:
    """Loads walk the row with a stride but neighbouring rows contiguously (a reduction
    over a leading axis): one thread per row then reads adjacent addresses across a warp."""
    n_outer = len(k.shape) - k.n_inner
    if not n_outer or not k.n_inner:
        return False
    loads = [e for e in kir.kernel_exprs(k) if isinstance(e, kir.Load)]
    along_row = any(e.index.coeffs[-1] == 1 for e in loads)
    across = any(e.index.coeffs[n_outer - 1] == 1 for e in loads)
    return across and not along_row


def _extents(k: kir.Kernel, n0_max: int) -> list[int]:
    return [n0_max] + list(k.shape[1:])


def needs_wide(k: kir.Kernel, n0_max: int) -> bool:
    """Whether some loop index or affine offset of k can reach 2^31 (then 64-bit math)."""
    ext = _extents(k, n0_max)
    limit = (1 << 31) - 1
    if prod(ext) > limit:
        return True
    reach = [max(e - 1, 0) for e in ext]
    for e in kir.kernel_exprs(k):
        for d, lo, hi in getattr(e, "clamps", ()):
            reach[d] = max(reach[d], abs(lo), abs(hi))
    affines = [s.index for s in k.stores]
    affines += [e.index for e in kir.kernel_exprs(k) if isinstance(e, (kir.Load, kir.Index))]
    for a in affines:
        if abs(a.const) + sum(abs(c) * r for c, r in zip(a.coeffs, reach)) > limit:
            return True
    return False


# ---- the vector path ------------------------------------------------------------------

def _accesses(k: kir.Kernel) -> list[tuple[int, kir.Affine, bool]]:
    """(buffer, index, simple) per load and store: simple = no clamps, no gather terms."""
    out = [(s.buf, s.index, True) for s in k.stores]
    for e in kir.kernel_exprs(k):
        if isinstance(e, kir.Load):
            out.append((e.buf, e.index, not e.clamps and not e.dyn))
    return out


def vectorizable(index: kir.Affine, v: int) -> bool:
    """Unit stride along the last loop dim and every vector start a multiple of v."""
    if not index.coeffs or index.coeffs[-1] != 1:
        return False
    return index.const % v == 0 and all(c % v == 0 for c in index.coeffs[:-1])


def vector_width(k: kir.Kernel) -> int:
    """Elements per thread step for an elementwise kernel (1: scalar path only).

    16 bytes of the widest contiguous operand per step. A kernel whose last dim is not a
    multiple of the width runs scalar unless it is 1-D (then a scalar tail finishes it).
    """
    dtypes = buffer_dtypes(k)
    counts: dict[int, int] = {}
    for s in k.stores:
        counts[s.buf] = counts.get(s.buf, 0) + 1
    cands = [(b, a) for b, a, simple in _accesses(k)
             if simple and a.coeffs and a.coeffs[-1] == 1 and counts.get(b, 0) <= 1]
    if not cands:
        return 1
    widest = max(_itemsize(dtypes[b]) for b, _ in cands)
    v = min(MAX_VECTOR, 16 // widest)
    last = k.shape[-1]
    while v > 1 and len(k.shape) > 1 and last % v:
        v //= 2
    if v > 1 and any(vectorizable(a, v) for _, a in cands):
        return v
    return 1


def _itemsize(dtype: str) -> int:
    return {"float16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8, "bool": 1,
            "bfloat16": 2, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2}[dtype]


def buffer_dtypes(k: kir.Kernel) -> dict[int, str]:
    """Storage dtype of every buffer kernel k touches."""
    out = {e.buf: e.dtype for e in kir.kernel_exprs(k) if isinstance(e, kir.Load)}
    for s in k.stores:
        out[s.buf] = s.expr.dtype
    return out
