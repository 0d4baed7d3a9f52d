"""Split-row kernels: a few very long rows, one block per chunk of a row (launch.py).

    ReduceSum of [1 | 4M] floats, chunks of 16384 (256 per row), blocks of 512 (CUDA):
      for (w = blockIdx.x; w < nrows * 256; w += gridDim.x)     one (row, chunk) per step
        row = w / 256; c0 = (w % 256) * 16384; c1 = min(c0 + 16384, R)
        a0 = the block's sum of x[row, c0:c1]      (lanes stride, shuffles, shared memory)
        lane 0: part0[w] = a0; __threadfence(); last = atomicAdd(&count[row], 1) == 255
        if (last)                                  (block-uniform, through shared memory)
          __threadfence(); a0 = the block's combine of part0[256*row + 0 .. 255]
          first-NaN rule, the row's stores, count[row] = 0

No block waits for another (the last to arrive does the rest), so any grid is correct.
The partials are combined in a fixed order (lanes stride the chunks, then the same tree)
whatever order the blocks finish in: a float sum has the same bits run to run. The
counter goes back to 0 in the launch that used it, so the next launch, and every CUDA
graph replay, starts clean. Partials are read through volatile pointers: another SM
wrote them, and this SM's L1 may hold a stale line of a neighbouring row's slots.

The workspace (`workspace_bytes`: one zeroed device allocation per kernel of an
executable, made once) holds nrows unsigned counters, then for every accumulator part
(a phase's value, and its position for arg kinds) nrows * chunks 8-byte slots. The C
target (hostsim) runs the same work loop over emulated blocks one after another, with the
same counters, chunk bounds, last-block combine and reset; lanes are emulated as in the
other row kernels (per-lane partials, then a tree).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from autoclust.backends.gpu import cstyle
from autoclust.backends.gpu.launch import Launch, prod
from autoclust.backends.gpu.prelude import arg_suffix

from autoclust.kernel import ir as kir

if TYPE_CHECKING:
    from autoclust.backends.gpu.kernels import KernelWriter

PARAM = "unsigned char* __restrict__ ac_ws"


def parts(k: kir.Kernel) -> list[tuple[int, str, str]]:
    """(phase, C type, name suffix) of every accumulator part of kernel k, in slot order."""
    return [(p, t, sfx) for p, red in enumerate(k.reductions)
            for t, sfx in cstyle.accumulator(red)]


def _counter_bytes(rows: int) -> int:
    return (4 * rows + 7) // 8 * 8


def workspace_bytes(k: kir.Kernel, launch: Launch, n0: int) -> int:
    """Bytes of the workspace a split-row launch of k with outer extent n0 needs."""
    rows = n0 * launch.unit
    return _counter_bytes(rows) + 8 * len(parts(k)) * rows * launch.chunks


def render_body(w: KernelWriter) -> None:
    """The body of a split-row kernel (after the signature line) into w.lines."""
    k, launch, u = w.k, w.launch, w.usuf
    lines = w.lines
    _prologue(w)
    n = prod(list(k.shape[w.n_outer:]))
    lines.append(f"    const {w.ux} row = ac_w / {launch.chunks}{u};")
    lines.append(f"    const long long ac_c0 = (long long)(ac_w % {launch.chunks}{u}) * "
                 f"{launch.chunk}LL;")
    lines.append(f"    const long long ac_c1 = ac_c0 + {launch.chunk}LL < {n}LL ? "
                 f"ac_c0 + {launch.chunk}LL : {n}LL;")
    outer = [f"i{d}" for d in range(w.n_outer)]
    w.decompose("row", list(k.shape[:w.n_outer]), outer, "    ")
    for p, red in enumerate(k.reductions):
        _reduce(w, p, red, functools.partial(_chunk_partial, w, p, red, outer))
    _arrive(w)
    for p, red in enumerate(k.reductions):
        _reduce(w, p, red, functools.partial(_combine_partials, w, p, red))
    reduced = [w._finish_phase(p, red, f"a{p}", outer, [])
               for p, red in enumerate(k.reductions)]
    w._row_stores(outer, reduced)
    if w.cuda:
        lines.append("    if (lane == 0) ac_count[row] = 0u;  /* the next launch starts clean */")
        lines.append("    }")
        lines.append("    __syncthreads();  /* ac_last is rewritten by the next work item */")
    else:
        lines.append("    ac_count[row] = 0u;  /* the next launch starts clean */")
        lines.append("    }")
    lines.append("  }")


def _prologue(w: KernelWriter) -> None:
    """The workspace pointers, shared memory, and the head of the (row, chunk) work loop."""
    k, launch, ux, u = w.k, w.launch, w.ux, w.usuf
    lines = w.lines
    lines.append(f"  const {ux} nrows = ({ux})n0 * {launch.unit}{u};")
    lines.append(f"  const {ux} nwork = nrows * {launch.chunks}{u};")
    lines.append("  unsigned* ac_count = (unsigned*)ac_ws;")
    lines.append("  unsigned char* ac_slots = ac_ws + ((unsigned long long)nrows * 4ull + 7ull)"
                 " / 8ull * 8ull;")
    for q, (p, t, sfx) in enumerate(parts(k)):
        lines.append(f"  volatile {t}* ac_part{p}{sfx} = (volatile {t}*)(ac_slots + "
                     f"{q}ull * nwork * 8ull);")
    if w.cuda:
        lines.append(f"  const unsigned lane = {w.tid};")
        for p, t, sfx in parts(k):
            lines.append(f"  __shared__ {t} s{p}{sfx}[32];")
        lines.append("  __shared__ int ac_last;")
        lines.append(f"  for ({ux} ac_w = {w.bid}; ac_w < nwork; ac_w += {w.gdim}) {{")
    else:  # the emulated blocks run one after another
        lines.append("  for (unsigned ac_bid = 0; ac_bid < ac_grid; ac_bid++)")
        lines.append(f"  for ({ux} ac_w = ac_bid; ac_w < nwork; ac_w += ac_grid) {{")


def _reduce(w: KernelWriter, p: int, red: kir.Reduction, fold) -> None:
    """a{p} = the block's reduction of what fold(lane, lanes) accumulates into a{p} per lane:
    CUDA lanes, then shuffles and shared memory; C: emulated lanes, then a tree."""
    lanes = w.launch.lanes

    def lane_partial(indent: str) -> None:
        for (t, sfx), init in zip(cstyle.accumulator(red), cstyle.accumulator_init(red)):
            w.lines.append(f"{indent}{t} a{p}{sfx} = {init};")
        fold("lane", lanes)

    if w.cuda:
        lane_partial("    ")
        w._cross_lane(p, red, f"a{p}")
    else:
        w.emulate_lanes(p, red, lambda: lane_partial("      "))


def _chunk_partial(w: KernelWriter, p: int, red: kir.Reduction, outer: list[str],
                   lane: str, lanes: int) -> None:
    """Fold this lane's elements of the chunk [ac_c0, ac_c1) of the row into a{p}."""
    indent = "      "
    inner = list(w.k.shape[w.n_outer:])
    w.lines.append(f"{indent}for ({w.ix} j = ({w.ix})ac_c0 + {lane}; j < ac_c1; "
                   f"j += {lanes}) {{")
    names = [f"i{w.n_outer + d}" for d in range(len(inner))]
    w.decompose("j", inner, names, indent + "  ")
    em = w.emitter(indent + "  ", outer + names, [])
    w._accumulate(red, f"a{p}", em.value(red.expr), "j", indent + "  ")
    w.lines.append(f"{indent}}}")


def _combine_partials(w: KernelWriter, p: int, red: kir.Reduction, lane: str,
                      lanes: int) -> None:
    """Fold this lane's chunks' partials of the row (chunk c at lane c % lanes) into a{p}."""
    indent = "      "
    chunks, u = w.launch.chunks, w.usuf
    w.lines.append(f"{indent}for ({w.ux} c = {lane}; c < {chunks}{u}; c += {lanes}{u}) {{")
    at = f"[row * {chunks}{u} + c]"
    if red.kind.startswith("arg"):
        fn = f"ac_{red.kind}_{arg_suffix(red.expr.dtype)}"
        w.lines.append(f"{indent}  {fn}(&a{p}v, &a{p}i, ac_part{p}v{at}, ac_part{p}i{at});")
    else:  # one volatile load: the combine may name its operand twice
        w.lines.append(f"{indent}  const {cstyle.compute(red.dtype)} q = ac_part{p}{at};")
        w.lines.append(f"{indent}  a{p} = {cstyle.combine(red.kind, red.dtype, f'a{p}', 'q')};")
    w.lines.append(f"{indent}}}")


def _arrive(w: KernelWriter) -> None:
    """Publish the chunk's partials and count the row's arrivals; open the last block's
    branch (closed by render_body)."""
    chunks, u = w.launch.chunks, w.usuf
    stores = [f"ac_part{p}{sfx}[ac_w] = a{p}{sfx};" for p, _, sfx in parts(w.k)]
    if w.cuda:
        w.lines.append("    if (lane == 0) {")
        w.lines += [f"      {s}" for s in stores]
        w.lines.append("      __threadfence();  /* the partials before the count */")
        w.lines.append(f"      ac_last = atomicAdd(&ac_count[row], 1u) == {chunks - 1}u;")
        w.lines.append("    }")
        w.lines.append("    __syncthreads();")
        w.lines.append("    if (ac_last) {  /* block-uniform: the last block of this row */")
        w.lines.append("    __threadfence();  /* then the other blocks' partials */")
    else:
        w.lines += [f"    {s}" for s in stores]
        w.lines.append(f"    if (ac_count[row]++ == {chunks - 1}{u}) {{  /* the last block */")
