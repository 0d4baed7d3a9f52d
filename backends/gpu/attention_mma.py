"""FusedAttention on tensor cores: float16/bfloat16 Q, K, V through mma.sync (m16n8k16,
float32 accumulators), FlashAttention-2's schedule.

A block of WARPS warps takes BQ = 16 * WARPS query rows of one batch index (a work item;
blocks grid-stride over nb * ceil(Sq / BQ)); each warp owns 16 rows, the M of one mma. The
warp keeps its rows of Q as mma A fragments in registers for the whole item, and walks the
keys in tiles of BK staged in shared memory: K as [key][d], V transposed as [dv][key], each
row padded by PAD halves (16-byte aligned rows; the fragment reads of 8 rows by 4 threads
hit 32 different banks). Per tile a warp:

    S = Q K^T                 D/16 x BK/8 mmas, S in accumulators (s[BK/8][4] a thread)
    scale, mask, -inf where hidden (the SIMT kernel's rules: attention.py `masked`)
    online softmax per row:   m' = max(m, row max of S)  (a row lives in the 4 threads of
                              a quad: two shuffles), p = exp(S - m') rounded to the storage
                              type, l = l * exp(m - m') + sum p, O *= exp(m - m')
    O += P V                  BK/16 x Dv/8 mmas; P's accumulators are already laid out as
                              the A fragments of the next mma (FlashAttention-2's trick)

and at the end writes O / l (with the SIMT kernel's rule for rows without a visible key).
P is rounded to the storage type before P V, as FlashAttention does; l sums the rounded
values, so each row's weights sum to 1 as used. Q K^T's products are exact and accumulate
in float32; the accumulation order inside an mma is the hardware's.

Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16", g = lane / 4, t = lane % 4):
A (16x16) a0..a7 in 4 registers, row g + 8 * ((i / 2) % 2), col 2t + i % 2 + 8 * (i / 4);
B (16x8) b0..b3 in 2 registers, row (k) 2t + i % 2 + 8 * (i / 2), col g; C/D (16x8)
c0..c3, row g + 8 * (i / 2), col 2t + i % 2. The lower-indexed element of a register is
its low 16 bits.

The C target (tests/support/hostsim.py) runs the same per-thread code over emulated warps
and lanes; its mma (`ac_mma_warp`) assembles the matrices from the 32 lanes' registers by
the layouts above, multiplies them in float and scatters D back, so a host run checks
every fragment index of the CUDA code against the PTX ISA's layout, not against itself.

Needs sm_80 or later (mma.m16n8k16 with float16 and bfloat16); head dims multiples of 16
(Q K^T's k) and of 8 (P V's n), up to 128. K and V tiles are read with 16-byte loads
where the views of Q, K and V allow it (last dim contiguous, other strides multiples of 8
elements) and the pointers are 16-byte aligned (checked at run time), else element by
element; Q goes to registers element by element, once per work item. V is read down the
keys (consecutive threads, consecutive keys), so a warp's transposed stores into the
[dv][key] tile fall in consecutive words.
"""

from __future__ import annotations

from typing import Any

WARPS = 4
BQ = 16 * WARPS            # query rows per block: 16 per warp (the mma's M)
BK = 64                    # keys per tile
BLOCK = 32 * WARPS
MIN_BLOCKS = 2             # per SM: up to 255 registers a thread; ~36 KB smem a block
MAX_HEAD_DIM = 128
PAD = 8                    # halves added to each shared row
U = "@unroll"              # a line of a per-thread body: #pragma unroll in CUDA, dropped in C

HELPERS = {
    "cuda": r"""
#ifndef AC_MMA_HELPERS
#define AC_MMA_HELPERS
struct AC_ALIGN(16) ac_u4 { unsigned x, y, z, w; };
#define AC_LD16(dst, src) (*(ac_u4*)(dst) = *(const ac_u4*)(src))
AC_FN void ac_mma_f16(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
AC_FN void ac_mma_bf16(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif
""",
    "c": r"""
#ifndef AC_MMA_HELPERS
#define AC_MMA_HELPERS
typedef struct { unsigned x, y, z, w; } ac_u4;
#define AC_LD16(dst, src) memcpy((dst), (src), 16)
/* One warp's mma.m16n8k16 (row.col, float32 accumulators): the matrices assembled from
   the 32 lanes' registers by the PTX ISA's fragment layouts, D = A B + C in float. */
AC_FN float ac_mma_elem(unsigned reg, int hi, int bf16) {
  const unsigned short h = (unsigned short)(hi ? reg >> 16 : reg & 0xffffu);
  return bf16 ? ac_bf2f(h) : ac_h2f(h);
}
AC_FN void ac_mma_warp(float d[32][4], const unsigned a[32][4], const unsigned b[32][2],
                       int bf16) {
  float am[16][16], bm[16][8];
  for (int ln = 0; ln < 32; ln++) {
    const int g = ln >> 2, t = ln & 3;
    for (int i = 0; i < 8; i++)
      am[g + 8 * ((i >> 1) & 1)][2 * t + (i & 1) + 8 * (i >> 2)] =
          ac_mma_elem(a[ln][i >> 1], i & 1, bf16);
    for (int i = 0; i < 4; i++)
      bm[2 * t + (i & 1) + 8 * (i >> 1)][g] = ac_mma_elem(b[ln][i >> 1], i & 1, bf16);
  }
  for (int ln = 0; ln < 32; ln++) {
    const int g = ln >> 2, t = ln & 3;
    for (int i = 0; i < 4; i++) {
      const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
      float acc = 0.0f;
      for (int k = 0; k < 16; k++) acc += am[row][k] * bm[k][col];
      d[ln][i] += acc;
    }
  }
}
#endif
""",
}


def eligible(dtype: str, d: int, dv: int) -> bool:
    """Whether the tensor-core kernel takes attention of this storage type and head dims."""
    return (dtype in ("float16", "bfloat16") and 0 < d <= MAX_HEAD_DIM and d % 16 == 0
            and 0 < dv <= MAX_HEAD_DIM and dv % 8 == 0)


def supported_here() -> bool:
    """False on a GPU older than sm_80 (no mma.m16n8k16); True where no GPU is visible
    (rendering for a dump or nvcc: the kernels target sm_90)."""
    from autoclust.backends.gpu import device

    from autoclust.errors import DeviceUnavailableError
    try:
        return int(device.info().arch) >= 80
    except DeviceUnavailableError:
        return True


class Tiles:
    """Writes the tensor-core kernel of a Spec with the helpers of attention.py's writer
    `w` (emit, batch_offsets, masked, final)."""

    def __init__(self, w: Any):
        self.w, self.s, self.cuda = w, w.s, w.cuda
        s = self.s
        self.kc, self.nt, self.nd = s.d // 16, BK // 8, s.dv // 8
        self.ks, self.vs = s.d + PAD, BK + PAD
        self.mma_fn = "ac_mma_bf16" if s.dtype == "bfloat16" else "ac_mma_f16"
        self.vec = all(self._vector_view(view) for view in s.views[:3])

    def emit(self, line: str) -> None:
        self.w.emit(line)

    @staticmethod
    def _vector_view(view: Any) -> bool:
        batch, (_, rs), (n, cs) = view
        return cs == 1 and n % 8 == 0 and rs % 8 == 0 and all(st % 8 == 0 for _, st in batch)

    def r(self, ref: str) -> str:
        """A per-thread variable (`name` or `name[i]...`): a register in CUDA, the emulated
        lane's slot in C."""
        if self.cuda:
            return ref
        name, _, rest = ref.partition("[")
        return f"{name}[warp][lane]" + ("[" + rest if rest else "")

    def lanes(self, ind: str, body: list[str]) -> None:
        """Per-thread statements: as they are in CUDA, over the warp's 32 lanes in C."""
        if self.cuda:  # a block of its own: its locals (r0, ...) may repeat in the next one
            self.emit(f"{ind}{{")
            for line in body:
                self.emit(f"{ind}  {line.replace(U, '#pragma unroll')}")
            self.emit(f"{ind}}}")
            return
        self.emit(f"{ind}for (int lane = 0; lane < 32; lane++) {{")
        self.emit(f"{ind}  const int g = lane >> 2, t4 = lane & 3;")
        for line in body:
            if line.strip() != U:
                self.emit(f"{ind}  {line}")
        self.emit(f"{ind}}}")

    def quad_reduce(self, ind: str, names: list[str], op: str) -> None:
        """Each of `names` combined (op: fmaxf or +) over the 4 threads of a quad, which
        share a row: shuffles by xor 1 and 2 in CUDA, the same butterfly over lanes in C."""
        comb = (lambda a, b: f"fmaxf({a}, {b})") if op == "max" else (lambda a, b: f"{a} + {b}")
        if self.cuda:
            for n in names:
                for sh in (1, 2):
                    self.emit(f"{ind}{n} = {comb(n, f'__shfl_xor_sync(0xffffffffu, {n}, {sh})')};")
            return
        for n in names:
            for sh in (1, 2):
                self.emit(f"{ind}{{ float tq[32]; for (int lane = 0; lane < 32; lane++) "
                          f"tq[lane] = {comb(f'{n}[warp][lane]', f'{n}[warp][lane ^ {sh}]')}; "
                          f"for (int lane = 0; lane < 32; lane++) {n}[warp][lane] = tq[lane]; }}")

    def mma(self, ind: str, acc: str, a: str, b0: str, b1: str) -> None:
        """acc (float[4] per thread) += A (4 registers) B (b0, b1): an expression of lane."""
        if self.cuda:
            self.emit(f"{ind}{self.mma_fn}({acc}, {a}, {b0}, {b1});")
            return
        self.emit(f"{ind}{{ float dq[32][4]; unsigned aq[32][4], bq[32][2];")
        self.lanes(ind + "  ", [(f"for (int i = 0; i < 4; i++) {{ dq[lane][i] = "
                                f"{self.r(acc)}[i]; aq[lane][i] = {self.r(a)}[i]; }}"),
                                f"bq[lane][0] = {b0}; bq[lane][1] = {b1};"])
        self.emit(f"{ind}  ac_mma_warp(dq, aq, bq, {int(self.s.dtype == 'bfloat16')});")
        self.lanes(ind + "  ", [(f"for (int i = 0; i < 4; i++) {self.r(acc)}[i] = "
                                "dq[lane][i];")])
        self.emit(f"{ind}}}")

    def pack(self, lo: str, hi: str) -> str:
        """Two compute values as one register of two storage-type halves (lo in bits 0-15)."""
        from autoclust.backends.gpu import cstyle
        t = self.s.dtype
        return self.pack_bits(cstyle.to_storage(lo, t), cstyle.to_storage(hi, t))

    @staticmethod
    def pack_bits(lo: str, hi: str) -> str:
        return f"((unsigned){lo} | ((unsigned){hi} << 16))"

    # ---- the kernel -------------------------------------------------------------------
    def render(self) -> str:
        s = self.s
        target = "cuda" if self.cuda else "c"
        self.emit(HELPERS[target])
        # its own launch bounds: more registers a thread than the CUDA-core kernel
        self.emit(self.w.signature(MIN_BLOCKS) + " {")
        pre = "__shared__ " if self.cuda else ""
        self.emit(f"  {pre}AC_ALIGN(16) unsigned short sk[{BK * self.ks}];")
        self.emit(f"  {pre}AC_ALIGN(16) unsigned short svt[{s.dv * self.vs}];")
        if self.cuda:
            self.emit("  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, "
                      "g = lane >> 2, t4 = lane & 3;")
            self.emit(f"  unsigned qa[{self.kc}][4]; float oa[{self.nd}][4], "
                      f"s[{self.nt}][4], m0, m1, l0, l1, mx0, mx1;")
            self.emit(f"  for (long long w = blockIdx.x; w < {s.items}LL; w += gridDim.x) {{")
        else:
            lanes = f"[{WARPS}][32]"
            self.emit(f"  unsigned qa{lanes}[{self.kc}][4];")
            self.emit(f"  float oa{lanes}[{self.nd}][4], s{lanes}[{self.nt}][4];")
            self.emit(f"  float m0{lanes}, m1{lanes}, l0{lanes}, l1{lanes}, mx0{lanes}, "
                      f"mx1{lanes};")
            self.emit("  for (unsigned blk = 0; blk < ac_grid; blk++)")
            self.emit(f"  for (long long w = blk; w < {s.items}LL; w += ac_grid) {{")
        ind = "    "
        self.work_head(ind)
        self.per_warp(ind, self.start_rows)
        self.emit(f"{ind}for (long long j0 = 0; j0 < kend; j0 += {BK}) {{")
        i2 = ind + "  "
        if self.cuda:
            self.emit(f"{i2}__syncthreads();  /* the previous tile is consumed */")
            self.load_tiles(i2)
            self.emit(f"{i2}__syncthreads();")
        else:
            self.emit(f"{i2}for (int tid = 0; tid < {BLOCK}; tid++) {{")
            self.load_tiles(i2 + "  ")
            self.emit(f"{i2}}}")
        self.per_warp(i2, self.tile_step)
        self.emit(f"{ind}}}")
        self.per_warp(ind, self.finish_rows)
        self.emit("  }")
        self.emit("}")
        return "\n".join(self.w.lines) + "\n"

    def per_warp(self, ind: str, body: Any) -> None:
        if self.cuda:
            body(ind)
            return
        self.emit(f"{ind}for (int warp = 0; warp < {WARPS}; warp++) {{")
        body(ind + "  ")
        self.emit(f"{ind}}}")

    def work_head(self, ind: str) -> None:
        s = self.s
        qtiles = -(-s.sq // BQ)
        self.emit(f"{ind}const long long b = w / {qtiles}, q0 = (w % {qtiles}) * {BQ};")
        self.w.batch_offsets(ind)
        self.emit(f"{ind}const long long off_o = b * {s.sq * s.dv}LL;")
        last = f"(q0 + {BQ - 1} < {s.sq - 1} ? q0 + {BQ - 1} : {s.sq - 1})"
        kend = f"({last} + {s.offset + 1} < {s.sk} ? {last} + {s.offset + 1} : {s.sk})" \
            if s.causal else f"{s.sk}"
        self.emit(f"{ind}const long long kend = {kend};")
        if self.vec:
            ptrs = " | ".join(f"(unsigned long long){n}" for n in "qkv")
            self.emit(f"{ind}const int vec = (({ptrs}) & 15ull) == 0;")

    def q_bits(self, row: str, col: str) -> str:
        """Q's element (row, col) as stored, 0 past the queries."""
        _, (_, rs), (_, cs) = self.s.views[0]
        raw = f"q[off_q + {row} * {rs}LL + (long long)({col}) * {cs}LL]"
        return f"({row} < {self.s.sq} ? {raw} : (unsigned short)0)"

    def start_rows(self, ind: str) -> None:
        """The warp's 16 rows of Q as A fragments; O, m and l cleared."""
        r = self.r
        body = ["const long long r0 = q0 + warp * 16 + g, r1 = r0 + 8;",
                U, f"for (int kc = 0; kc < {self.kc}; kc++)", U,
                "for (int i = 0; i < 4; i++) {",
                "  const long long row = (i & 1) ? r1 : r0;",
                "  const int col = kc * 16 + 2 * t4 + 8 * (i >> 1);",
                (f"  {r('qa')}[kc][i] = "
                 f"{self.pack_bits(self.q_bits('row', 'col'), self.q_bits('row', 'col + 1'))};"),
                "}",
                U, f"for (int n = 0; n < {self.nd}; n++)", U,
                f"for (int i = 0; i < 4; i++) {r('oa')}[n][i] = 0.0f;",
                (f"{r('m0')} = -AC_INFF; {r('m1')} = -AC_INFF; {r('l0')} = 0.0f; "
                f"{r('l1')} = 0.0f;")]
        self.lanes(ind, body)

    def load_tiles(self, ind: str) -> None:
        """K rows j0.. as sk[key][d], V as svt[dv][key]; zeros past the keys (a zero V row
        times p = 0 stays 0, where stale or NaN data would not)."""
        s = self.s
        (_, (_, krs), (_, kcs)), (_, (_, vrs), (_, vcs)) = s.views[1], s.views[2]
        if self.vec:
            self.emit(f"{ind}if (vec) {{")
            self.vector_loads(ind + "  ", krs, vrs)
            self.emit(f"{ind}}} else {{")
            self.scalar_loads(ind + "  ", krs, kcs, vrs, vcs)
            self.emit(f"{ind}}}")
        else:
            self.scalar_loads(ind, krs, kcs, vrs, vcs)

    def scalar_loads(self, ind: str, krs: int, kcs: int, vrs: int, vcs: int) -> None:
        s = self.s
        for name, n, rs, cs, dst in (("k", s.d, krs, kcs, f"sk[rr * {self.ks} + cc]"),
                                     ("v", s.dv, vrs, vcs, f"svt[cc * {self.vs} + rr]")):
            self.emit(f"{ind}for (int t = tid; t < {BK * n}; t += {BLOCK}) {{")
            # consecutive threads read consecutive elements of the stride-1 dim
            pos = ("t % {bk}", "t / {bk}") if rs == 1 and cs != 1 else ("t / {n}", "t % {n}")
            self.emit(f"{ind}  const int rr = {pos[0].format(bk=BK, n=n)}, "
                      f"cc = {pos[1].format(bk=BK, n=n)};")
            self.emit(f"{ind}  const long long row = j0 + rr;")
            self.emit(f"{ind}  {dst} = row < {s.sk} ? {name}[off_{name} + row * {rs}LL + "
                      f"(long long)cc * {cs}LL] : (unsigned short)0;")
            self.emit(f"{ind}}}")

    def vector_loads(self, ind: str, krs: int, vrs: int) -> None:
        s = self.s
        for name, n, rs in (("k", s.d, krs), ("v", s.dv, vrs)):
            per = n // 8
            self.emit(f"{ind}for (int t = tid; t < {BK * per}; t += {BLOCK}) {{")
            if name == "k":  # consecutive threads along a row: coalesced, stored as read
                self.emit(f"{ind}  const int rr = t / {per}, cc = (t % {per}) * 8;")
            else:
                # consecutive threads down the keys: their transposed stores fall in
                # consecutive words (along a row, 16 of a warp's threads would store to
                # one bank: (8 j + e) * vs halves apart, 4 * vs = 288 = 0 mod 32 words)
                self.emit(f"{ind}  const int rr = t % {BK}, cc = (t / {BK}) * 8;")
            self.emit(f"{ind}  const long long row = j0 + rr;")
            self.emit(f"{ind}  ac_u4 x = {{0u, 0u, 0u, 0u}};")
            self.emit(f"{ind}  if (row < {s.sk}) AC_LD16(&x, &{name}[off_{name} + row * "
                      f"{rs}LL + cc]);")
            if name == "k":
                self.emit(f"{ind}  AC_LD16(&sk[rr * {self.ks} + cc], &x);")
            else:
                self.emit(f"{ind}  const unsigned xs[4] = {{x.x, x.y, x.z, x.w}};")
                self.emit(f"{ind}  for (int e = 0; e < 8; e++) svt[(cc + e) * {self.vs} + rr] "
                          "= (unsigned short)(xs[e >> 1] >> (16 * (e & 1)));")
            self.emit(f"{ind}}}")

    def tile_step(self, ind: str) -> None:
        """One key tile for the warp's 16 rows: S, masks, online softmax, O += P V."""
        r = self.r
        unroll = [f"{ind}#pragma unroll"] if self.cuda else []
        self.lanes(ind, [U, f"for (int n = 0; n < {self.nt}; n++)", U,
                         f"for (int i = 0; i < 4; i++) {r('s')}[n][i] = 0.0f;"])
        # S = Q K^T: B's (k = d, n = key) element is K[key][d]; b0 holds d = 2t, 2t + 1 of
        # key g, b1 the same 8 dims on
        for line in unroll:
            self.emit(line)
        self.emit(f"{ind}for (int kc = 0; kc < {self.kc}; kc++) {{")
        self.mma_row(ind + "  ", self.nt, "s[n]", "qa[kc]", "sk", self.ks)
        self.emit(f"{ind}}}")
        self.masked_scores(ind)
        self.online_softmax(ind)
        self.pv(ind)

    def masked_scores(self, ind: str) -> None:
        """S scaled and masked element by element (row g or g + 8, key 2t + i % 2 of
        tile n); the row maxima of the tile over the quad."""
        s, r = self.s, self.r
        body = ["const long long r0 = q0 + warp * 16 + g, r1 = r0 + 8;",
                U, f"for (int n = 0; n < {self.nt}; n++)", U,
                "for (int i = 0; i < 4; i++) {",
                "  const long long i_q = (i < 2) ? r0 : r1;",
                "  const long long j = j0 + n * 8 + 2 * t4 + (i & 1);",
                f"  float sc = {r('s')}[n][i];"]
        mark = len(self.w.lines)
        self.w.masked("  ", "sc", "i_q", "j", f"i_q < {s.sq}")
        body += self.w.lines[mark:]
        del self.w.lines[mark:]
        body += [f"  {r('s')}[n][i] = sc;", "}",
                 f"{r('mx0')} = -AC_INFF; {r('mx1')} = -AC_INFF;",
                 U, f"for (int n = 0; n < {self.nt}; n++) {{",
                 f"  {r('mx0')} = fmaxf({r('mx0')}, fmaxf({r('s')}[n][0], {r('s')}[n][1]));",
                 f"  {r('mx1')} = fmaxf({r('mx1')}, fmaxf({r('s')}[n][2], {r('s')}[n][3]));",
                 "}"]
        self.lanes(ind, body)
        self.quad_reduce(ind, ["mx0", "mx1"], "max")

    def online_softmax(self, ind: str) -> None:
        """p = exp(S - m') rounded to the storage type (P V's A operand); l sums it; O and
        l rescaled by exp(m - m')."""
        r = self.r
        rnd = self._round("e")
        body = [(f"const float mn0 = fmaxf({r('m0')}, {r('mx0')}), "
                f"mn1 = fmaxf({r('m1')}, {r('mx1')});"),
                f"const float c0 = mn0 == -AC_INFF ? 1.0f : expf({r('m0')} - mn0);",
                f"const float c1 = mn1 == -AC_INFF ? 1.0f : expf({r('m1')} - mn1);",
                "float ps0 = 0.0f, ps1 = 0.0f;",
                U, f"for (int n = 0; n < {self.nt}; n++)", U,
                "for (int i = 0; i < 4; i++) {",
                "  const float mn = (i < 2) ? mn0 : mn1;",
                f"  const float e = mn == -AC_INFF ? 0.0f : expf({r('s')}[n][i] - mn);",
                f"  const float p = {rnd};",
                f"  {r('s')}[n][i] = p;",
                "  if (i < 2) ps0 += p; else ps1 += p;",
                "}",
                f"{r('l0')} = {r('l0')} * c0 + ps0; {r('l1')} = {r('l1')} * c1 + ps1;",
                U, (f"for (int n = 0; n < {self.nd}; n++) {{ {r('oa')}[n][0] *= c0; "
                f"{r('oa')}[n][1] *= c0; {r('oa')}[n][2] *= c1; {r('oa')}[n][3] *= c1; }}"),
                f"{r('m0')} = mn0; {r('m1')} = mn1;"]
        self.lanes(ind, body)

    def pv(self, ind: str) -> None:
        """O += P V."""
        unroll = [f"{ind}#pragma unroll"] if self.cuda else []
        # P's accumulators for keys 16 kc.. (tiles 2 kc, 2 kc + 1) are the A
        # fragment; B's (k = key, n = dv) element is V[key][dv] = svt[dv][key]
        for line in unroll:
            self.emit(line)
        self.emit(f"{ind}for (int kc = 0; kc < {BK // 16}; kc++) {{")
        sv = self.r("s")
        pa = [self.pack(f"{sv}[2 * kc + {n}][{i}]", f"{sv}[2 * kc + {n}][{i + 1}]")
              for n, i in ((0, 0), (0, 2), (1, 0), (1, 2))]
        if self.cuda:
            self.emit(f"{ind}  const unsigned pa[4] = {{{', '.join(pa)}}};")
        else:
            self.emit(f"{ind}  unsigned pa[{WARPS}][32][4];")
            self.lanes(ind + "  ", [f"pa[warp][lane][{k}] = {e};" for k, e in enumerate(pa)])
        self.mma_row(ind + "  ", self.nd, "oa[n]", "pa", "svt", self.vs)
        self.emit(f"{ind}}}")

    def mma_row(self, ind: str, count: int, acc: str, a: str, smem: str, stride: int) -> None:
        """For n < count: acc += A (registers a) B, B's column g of tile n being the
        shared row n * 8 + g of `smem` from key/dim 16 kc (b0: 2t, 2t + 1; b1: 8 on)."""
        if self.cuda:
            self.emit(f"{ind}#pragma unroll")
        self.emit(f"{ind}for (int n = 0; n < {count}; n++) {{")
        at = f"(n * 8 + g) * {stride} + kc * 16 + 2 * t4"
        self.mma(ind + "  ", acc, a, self.word(f"{smem}[{at}]"), self.word(f"{smem}[{at} + 8]"))
        self.emit(f"{ind}}}")

    def _round(self, e: str) -> str:
        from autoclust.backends.gpu import cstyle
        t = self.s.dtype
        return cstyle.from_storage(cstyle.to_storage(e, t), t)

    def word(self, ref: str) -> str:
        """The two halves at ref and the next as one register (the lower one in bits 0-15;
        ref is at an even index of a 16-byte aligned array)."""
        if self.cuda:
            return f"*(const unsigned*)&{ref}"
        base = ref.split("[", 1)
        idx = base[1].rsplit("]", 1)[0]
        return f"((unsigned){base[0]}[{idx}] | ((unsigned){base[0]}[{idx} + 1] << 16))"

    def finish_rows(self, ind: str) -> None:
        """l summed over the quad; O / l written (rows past Sq skipped)."""
        from autoclust.backends.gpu import cstyle
        s, r = self.s, self.r
        self.quad_reduce(ind, ["l0", "l1"], "sum")
        body = ["const long long r0 = q0 + warp * 16 + g, r1 = r0 + 8;",
                U, f"for (int n = 0; n < {self.nd}; n++)", U,
                "for (int i = 0; i < 4; i++) {",
                "  const long long i_q = (i < 2) ? r0 : r1;",
                f"  if (i_q >= {s.sq}) continue;",
                f"  const float ls = (i < 2) ? {r('l0')} : {r('l1')};",
                f"  const float y = {self.w.final(r('oa') + '[n][i]', 'ls')};",
                (f"  o[off_o + i_q * {s.dv}LL + n * 8 + 2 * t4 + (i & 1)] = "
                f"{cstyle.to_storage('y', s.dtype)};"),
                "}"]
        self.lanes(ind, body)
