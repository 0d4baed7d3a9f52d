"""FusedAttention (autoclust/ops/attention.py) as one kernel: the scores never leave the chip.

FlashAttention's schedule on CUDA cores: a block of WARPS warps takes BQ = WARPS * ROWS
query rows of one batch index (a work item; blocks grid-stride over nb * ceil(Sq / BQ)),
stages them in shared memory, then walks the keys in tiles of 32 staged in shared memory
(K padded to D + 1 floats per key: no bank conflicts). For each of its rows a warp:

    lane j scores key j0 + j:  s = (q . k_j) * scale (+ mask | select), -inf where masked
    online softmax:            m' = max(m, max over lanes s); p = exp(s - m');
                               l = l * exp(m - m') + p        (per lane, summed at the end)
    acc[d] = acc[d] * exp(m - m') + sum over the tile's keys p_j * v_j[d]
                               (lane owns d = lane, lane + 32, ...: p_j by shuffle)

and at the end writes acc / sum(l) (0 for a row with no key, or NaN: as Softmax gives for a
row of -inf, unless the exporter's IsNaN guard asked for 0). A causal block skips the key
tiles past its last row's diagonal. Q, K, V and the mask are read through their strided
views (head split, K transposed, grouped-query heads); the output is [nb, Sq, Dv].
Storage float32, float16 or bfloat16; math in float32; head dims up to MAX_HEAD_DIM.

The C target (hostsim) runs the same arithmetic in the same order -- each lane's dot
product, the butterflies of the max and the sum, the shuffled p_j in lane order -- over
emulated warps and lanes, so the host run checks the indexing, masking and NaN rules of the
CUDA code. float16/bfloat16 attention with head dims that are multiples of 16 has a
tensor-core kernel (attention_mma.py) behind --gpu_mma_attention.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

from autoclust.backends.gpu import attention_mma, cstyle

from autoclust.kernel import ir as kir
from autoclust.ops import attention as attn

WARPS = 4
ROWS = 2                   # query rows per warp
BQ = WARPS * ROWS          # query rows per block
BK = 32                    # keys per tile: one per lane
MAX_HEAD_DIM = 128         # acc is ceil(Dv / 32) floats per lane and row
BLOCK = 32 * WARPS
MIN_BLOCKS = 4             # per SM: up to 128 registers a thread (ptxas spilled a few bytes
                           # at 64 with the block size alone); 4 x <= 37 KB smem fits an SM


@dataclasses.dataclass(frozen=True)
class Spec:
    """Everything the kernel text depends on."""

    nb: int
    sq: int
    sk: int
    d: int
    dv: int
    dtype: str                 # Q, K, V and output storage
    views: tuple               # q, k, v (and mask) views
    mask: str                  # "", "add", "select"
    mask_dtype: str
    scale: float
    fill: float
    causal: int
    offset: int
    nan_to_zero: int
    mma: int = 0               # the tensor-core kernel (attention_mma.py)

    @property
    def items(self) -> int:
        return self.nb * -(-self.sq // (attention_mma.BQ if self.mma else BQ))


def spec(t: kir.LibraryCall, buffers: dict[int, kir.Buffer], mma: bool = False) -> Spec:
    """The kernel's parameters from a FusedAttention call and its buffers; `mma` asks for
    the tensor-core kernel where attention_mma.eligible allows it."""
    a = dict(t.attrs)
    views = [attn.view_of(a[f"{n}_view"]) for n in "qkv"]
    mask = a.get("mask", "")
    if mask:
        views.append(attn.view_of(a["m_view"]))
    q, v = views[0], views[2]
    nb = math.prod(int(d) for d in a.get("batch", []))
    dtype = buffers[t.inputs[0]].dtype
    return Spec(nb, q[1][0], views[1][1][0], q[2][0], v[2][0], dtype,
                tuple(views), mask, buffers[t.inputs[3]].dtype if mask else "",
                float(a.get("scale", 1.0)), float(a.get("fill", -math.inf)),
                int(a.get("causal", 0)), int(a.get("causal_offset", 0)),
                int(a.get("nan_to_zero", 0)),
                int(mma and attention_mma.eligible(dtype, q[2][0], v[2][0])))


def symbol(s: Spec) -> str:
    return "attn_" + hashlib.sha1(repr(s).encode()).hexdigest()[:16]


def render(s: Spec, target: str, name: str) -> str:
    """The kernel's text for target "cuda" or "c"."""
    w = _Writer(s, target == "cuda", name)
    return attention_mma.Tiles(w).render() if s.mma else w.render()


class _Writer:
    def __init__(self, s: Spec, cuda: bool, name: str):
        self.s, self.cuda, self.name = s, cuda, name
        self.lines: list[str] = []
        self.dvl = max(1, -(-s.dv // 32))  # output dims per lane

    def emit(self, line: str) -> None:
        self.lines.append(line)

    # ---- pieces ----------------------------------------------------------------------
    def signature(self, min_blocks: int = MIN_BLOCKS) -> str:
        t = cstyle.storage(self.s.dtype)
        params = [f"const {t}* __restrict__ q", f"const {t}* __restrict__ k",
                  f"const {t}* __restrict__ v"]
        if self.s.mask:
            params.append(f"const {cstyle.storage(self.s.mask_dtype)}* __restrict__ m")
        params.append(f"{t}* __restrict__ o")
        if self.cuda:
            return (f'extern "C" __global__ void __launch_bounds__({BLOCK}, {min_blocks}) '
                    f"{self.name}({', '.join(params)})")
        return f"void {self.name}({', '.join(params + ['unsigned ac_grid', 'unsigned ac_block'])})"

    def batch_offsets(self, indent: str) -> None:
        """off_q, off_k, off_v (and off_m): each view's element offset of batch index b."""
        for name, (batch, _, _) in zip("qkvm", self.s.views):
            self.emit(f"{indent}long long off_{name} = 0;")
            if batch:
                self.emit(f"{indent}{{ unsigned long long r = b;")
                for size, stride in reversed(batch):
                    self.emit(f"{indent}  off_{name} += (long long)(r % {size}ull) * {stride}LL; "
                              f"r /= {size}ull;")
                self.emit(f"{indent}}}")

    def tile_load(self, indent: str, dst: str, src: str, view: attn.View, rows: str,
                  first: str, limit: str, cols: int, pad: int, tid: str, nthreads: str,
                  scale: str = "") -> None:
        """dst[r][c] = src row first + r (< limit, else 0) of `rows` rows, col c < cols."""
        _, (_, rs), (_, cs) = view
        n = f"{rows} * {cols}"
        # consecutive threads take consecutive elements of the stride-1 dim (coalesced)
        by_col = not (rs == 1 and cs != 1)
        r, c = (f"t / {cols}", f"t % {cols}") if by_col else (f"t % {rows}", f"t / {rows}")
        self.emit(f"{indent}for (int t = {tid}; t < {n}; t += {nthreads}) {{")
        self.emit(f"{indent}  const int rr = {r}, cc = {c};")
        self.emit(f"{indent}  const long long row = (long long){first} + rr;")
        raw = f"{src}[off_{src} + row * {rs}LL + (long long)cc * {cs}LL]"
        val = cstyle.from_storage(raw, self.s.dtype)
        self.emit(f"{indent}  {dst}[rr * {cols + pad} + cc] = row < {limit} ? {val} : 0.0f;")
        self.emit(f"{indent}}}")

    def score(self, indent: str, row: str, i: str, j: str, valid_row: str) -> None:
        """const float sc = the score of query i (staged row `row`) and key j (lane)."""
        d = self.s.d
        self.emit(f"{indent}float sc = 0.0f;")
        self.emit(f"{indent}for (int c = 0; c < {d}; c++) sc += sq[{row} * {d} + c] * "
                  f"sk[lane * {d + 1} + c];")
        self.masked(indent, "sc", i, j, valid_row)

    def masked(self, indent: str, sc: str, i: str, j: str, valid_row: str) -> None:
        """sc (the dot product of query i and key j) scaled, then -inf where key j is
        hidden from query i (past the keys, an invalid row, causal) or the mask's value."""
        s = self.s
        if s.scale != 1.0:
            self.emit(f"{indent}{sc} = {sc} * {cstyle.constant(s.scale, 'float32')};")
        hidden = [f"{j} >= {s.sk}", f"!({valid_row})"]
        if s.causal:
            hidden.append(f"{j} > {i} + {s.offset}")
        self.emit(f"{indent}if ({' || '.join(hidden)}) {{")
        self.emit(f"{indent}  {sc} = -AC_INFF;")
        if s.mask:
            _, (_, mrs), (_, mcs) = s.views[3]
            raw = f"m[off_m + (long long){i} * {mrs}LL + (long long){j} * {mcs}LL]"
            self.emit(f"{indent}}} else {{")
            if s.mask == "add":
                self.emit(f"{indent}  {sc} = {sc} + {cstyle.from_storage(raw, s.mask_dtype)};")
            else:
                fill = cstyle.constant(s.fill, "float32")
                self.emit(f"{indent}  if ({raw} == 0) {sc} = {fill};")
        self.emit(f"{indent}}}")

    def final(self, acc: str, ls: str) -> str:
        """A row's output element: acc / ls, or the value of a row without a visible key
        (0 for an empty key range or under the exporters' NaN guard, else NaN: as Softmax
        gives for a row of -inf)."""
        s = self.s
        empty = "0.0f" if s.nan_to_zero or s.sk == 0 else "AC_NANF"
        # the exporters' guard zeroes every NaN probability: a NaN or empty sum gives 0
        # (torch's guard, nan_to_zero 2, zeroes the rows of -inf only: a NaN sum stays)
        bad = f"!({ls} > 0.0f)" if s.nan_to_zero == 1 else f"{ls} == 0.0f"
        return f"{bad} ? {empty} : {acc} / {ls}"

    # ---- CUDA ------------------------------------------------------------------------
    def render(self) -> str:
        self.emit(self.signature() + " {")
        if self.cuda:
            self.cuda_body()
        else:
            self.c_body()
        self.emit("}")
        return "\n".join(self.lines) + "\n"

    def _shared(self, prefix: str) -> None:
        s = self.s
        self.emit(f"  {prefix}float sq[{BQ * max(s.d, 1)}];")
        self.emit(f"  {prefix}float sk[{BK * (s.d + 1)}];")
        self.emit(f"  {prefix}float sv[{BK * max(s.dv, 1)}];")

    def _work_head(self, ind: str) -> None:
        s = self.s
        qtiles = -(-s.sq // BQ)
        self.emit(f"{ind}const long long b = w / {qtiles}, q0 = (w % {qtiles}) * {BQ};")
        self.batch_offsets(ind)
        self.emit(f"{ind}long long off_o = b * {s.sq * s.dv}LL;")
        last = f"(q0 + {BQ - 1} < {s.sq - 1} ? q0 + {BQ - 1} : {s.sq - 1})"
        kend = f"({last} + {s.offset + 1} < {s.sk} ? {last} + {s.offset + 1} : {s.sk})" \
            if s.causal else f"{s.sk}"
        self.emit(f"{ind}const long long kend = {kend};")

    def cuda_body(self) -> None:
        """Rows and output dims unrolled here into scalars (mrow0, acc1_2, ...): arrays
        indexed in loops ptxas did not unroll went to local memory."""
        s, dvl = self.s, self.dvl
        self._shared("__shared__ ")
        self.emit("  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;")
        self.emit(f"  for (long long w = blockIdx.x; w < {s.items}LL; w += gridDim.x) {{")
        ind = "    "
        self._work_head(ind)
        self.emit(f"{ind}__syncthreads();  /* the previous item's tiles are consumed */")
        self.tile_load(ind, "sq", "q", s.views[0], str(BQ), "q0", str(s.sq), s.d, 0, "tid",
                       str(BLOCK))
        for rr in range(ROWS):
            accs = ", ".join(f"acc{rr}_{t} = 0.0f" for t in range(dvl))
            self.emit(f"{ind}float mrow{rr} = -AC_INFF, l{rr} = 0.0f, {accs};")
        self.emit(f"{ind}for (long long j0 = 0; j0 < kend; j0 += {BK}) {{")
        i2 = ind + "  "
        self.emit(f"{i2}__syncthreads();")
        self.tile_load(i2, "sk", "k", s.views[1], str(BK), "j0", str(s.sk), s.d, 1, "tid",
                       str(BLOCK))
        self.tile_load(i2, "sv", "v", s.views[2], str(BK), "j0", str(s.sk), s.dv, 0, "tid",
                       str(BLOCK))
        self.emit(f"{i2}__syncthreads();")
        self.emit(f"{i2}const long long j = j0 + lane;")
        for rr in range(ROWS):
            self.cuda_row(i2, rr)
        self.emit(f"{ind}}}")
        for rr in range(ROWS):
            self.emit(f"{ind}{{")
            self.emit(f"{ind}  float ls = l{rr};")
            self.emit(f"{ind}  for (int sh = 16; sh > 0; sh >>= 1) "
                      "ls += __shfl_xor_sync(0xffffffffu, ls, sh);")
            self.emit(f"{ind}  const long long i = q0 + warp * {ROWS} + {rr};")
            self.emit(f"{ind}  if (i < {s.sq}) {{")
            self.store(ind + "    ", lambda t, rr=rr: f"acc{rr}_{t}", "ls")
            self.emit(f"{ind}  }}")
            self.emit(f"{ind}}}")
        self.emit("  }")

    def cuda_row(self, ind: str, rr: int) -> None:
        """One row's tile step (lane = key j): score, online softmax, P V."""
        s, dvl = self.s, self.dvl
        self.emit(f"{ind}{{")
        i3 = ind + "  "
        self.emit(f"{i3}const int row = warp * {ROWS} + {rr};")
        self.emit(f"{i3}const long long i = q0 + row;")
        self.score(i3, "row", "i", "j", f"i < {s.sq}")
        self.emit(f"{i3}float mt = sc;")
        self.emit(f"{i3}for (int sh = 16; sh > 0; sh >>= 1) "
                  "mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, sh));")
        self.emit(f"{i3}const float mn = fmaxf(mrow{rr}, mt);")
        self.emit(f"{i3}const float p = mn == -AC_INFF ? 0.0f : expf(sc - mn);")
        self.emit(f"{i3}const float corr = mn == -AC_INFF ? 1.0f : expf(mrow{rr} - mn);")
        self.emit(f"{i3}l{rr} = l{rr} * corr + p;")
        for t in range(dvl):
            self.emit(f"{i3}acc{rr}_{t} *= corr;")
        self.emit(f"{i3}for (int jj = 0; jj < {BK}; jj++) {{")
        self.emit(f"{i3}  const float pj = __shfl_sync(0xffffffffu, p, jj);")
        for t in range(dvl):
            dd = f"lane + {32 * t}"
            guard = f"if ({dd} < {s.dv}) " if 32 * (t + 1) > s.dv else ""
            self.emit(f"{i3}  {guard}acc{rr}_{t} += pj * sv[jj * {max(s.dv, 1)} + {dd}];")
        self.emit(f"{i3}}}")
        self.emit(f"{i3}mrow{rr} = mn;")
        self.emit(f"{ind}}}")

    def store(self, indent: str, acc, ls: str) -> None:
        """o[i][lane + 32 t] = acc(t) / ls, or the value of a row without a visible key."""
        s = self.s
        for t in range(self.dvl) if self.cuda else [None]:
            if self.cuda:
                dd, a = f"lane + {32 * t}", acc(t)
                self.emit(f"{indent}if ({dd} < {s.dv}) {{")
            else:
                dd, a = "dd", acc("t")
                self.emit(f"{indent}for (int t = 0; t < {self.dvl}; t++) {{")
                self.emit(f"{indent}  const int dd = lane + 32 * t;")
                self.emit(f"{indent}  if (dd >= {s.dv}) continue;")
            self.emit(f"{indent}  const float y = {self.final(a, ls)};")
            self.emit(f"{indent}  o[off_o + i * {s.dv}LL + {dd}] = "
                      f"{cstyle.to_storage('y', s.dtype)};")
            self.emit(f"{indent}}}")

    # ---- C (emulated warps and lanes) ------------------------------------------------
    def c_body(self) -> None:
        s, dvl = self.s, self.dvl
        self._shared("")
        self.emit("  for (unsigned blk = 0; blk < ac_grid; blk++)")
        self.emit(f"  for (long long w = blk; w < {s.items}LL; w += ac_grid) {{")
        ind = "    "
        self._work_head(ind)
        self.tile_load(ind, "sq", "q", s.views[0], str(BQ), "q0", str(s.sq), s.d, 0, "0", "1")
        self.emit(f"{ind}float mrow[{BQ}], l[{BQ}][32], acc[{BQ}][32][{dvl}];")
        self.emit(f"{ind}for (int row = 0; row < {BQ}; row++) {{ mrow[row] = -AC_INFF; "
                  "for (int lane = 0; lane < 32; lane++) { l[row][lane] = 0.0f; "
                  f"for (int t = 0; t < {dvl}; t++) acc[row][lane][t] = 0.0f; }} }}")
        self.emit(f"{ind}for (long long j0 = 0; j0 < kend; j0 += {BK}) {{")
        i2 = ind + "  "
        self.tile_load(i2, "sk", "k", s.views[1], str(BK), "j0", str(s.sk), s.d, 1, "0", "1")
        self.tile_load(i2, "sv", "v", s.views[2], str(BK), "j0", str(s.sk), s.dv, 0, "0", "1")
        self.emit(f"{i2}for (int row = 0; row < {BQ}; row++) {{")
        i3 = i2 + "  "
        self.emit(f"{i3}const long long i = q0 + row;")
        self.emit(f"{i3}float s[32], pl[32];")
        self.emit(f"{i3}for (int lane = 0; lane < 32; lane++) {{")
        self.emit(f"{i3}  const long long j = j0 + lane;")
        self.score(i3 + "  ", "row", "i", "j", f"i < {s.sq}")
        self.emit(f"{i3}  s[lane] = sc;")
        self.emit(f"{i3}}}")
        self.emit(f"{i3}float t32[32];")  # the butterfly, lane 0's view (every lane agrees)
        self.emit(f"{i3}for (int lane = 0; lane < 32; lane++) t32[lane] = s[lane];")
        self.emit(f"{i3}for (int sh = 16; sh > 0; sh >>= 1) for (int lane = 0; lane < sh; "
                  "lane++) t32[lane] = fmaxf(t32[lane], t32[lane + sh]);")
        self.emit(f"{i3}const float mn = fmaxf(mrow[row], t32[0]);")
        self.emit(f"{i3}const float corr = mn == -AC_INFF ? 1.0f : expf(mrow[row] - mn);")
        self.emit(f"{i3}for (int lane = 0; lane < 32; lane++) {{")
        self.emit(f"{i3}  pl[lane] = mn == -AC_INFF ? 0.0f : expf(s[lane] - mn);")
        self.emit(f"{i3}  l[row][lane] = l[row][lane] * corr + pl[lane];")
        self.emit(f"{i3}}}")
        self.emit(f"{i3}for (int lane = 0; lane < 32; lane++) {{")
        self.emit(f"{i3}  for (int t = 0; t < {dvl}; t++) acc[row][lane][t] *= corr;")
        self.emit(f"{i3}  for (int jj = 0; jj < {BK}; jj++) for (int t = 0; t < {dvl}; t++) {{")
        self.emit(f"{i3}    const int dd = lane + 32 * t;")
        self.emit(f"{i3}    if (dd < {s.dv}) acc[row][lane][t] += pl[jj] * "
                  f"sv[jj * {max(s.dv, 1)} + dd];")
        self.emit(f"{i3}  }}")
        self.emit(f"{i3}}}")
        self.emit(f"{i3}mrow[row] = mn;")
        self.emit(f"{i2}}}")
        self.emit(f"{ind}}}")
        self.emit(f"{ind}for (int row = 0; row < {BQ}; row++) {{")
        self.emit(f"{ind}  const long long i = q0 + row;")
        self.emit(f"{ind}  if (i >= {s.sq}) continue;")
        self.emit(f"{ind}  float t32[32];")
        self.emit(f"{ind}  for (int lane = 0; lane < 32; lane++) t32[lane] = l[row][lane];")
        self.emit(f"{ind}  for (int sh = 16; sh > 0; sh >>= 1) for (int lane = 0; lane < sh; "
                  "lane++) t32[lane] = t32[lane] + t32[lane + sh];")
        self.emit(f"{ind}  for (int lane = 0; lane < 32; lane++) {{")
        self.store(ind + "    ", lambda t: f"acc[row][lane][{t}]", "t32[0]")
        self.emit(f"{ind}  }}")
        self.emit(f"{ind}}}")
        self.emit("  }")
