"""One kernel IR Kernel -> one C function, for the CUDA target or the host C target.

The CUDA function is `extern "C" __global__ void NAME(b0, b1, ..., long long n0)`: buffer
pointers in the shared code's order (kernel_passes.distinct_kernels), then the outer loop
extent n0 (code is shared across outer extents). The C function takes two more arguments,
the grid and block sizes it emulates. Elementwise, vector and scan kernels run their exact
CUDA loop structure over emulated (block, thread) pairs; row kernels emulate their lanes
(per-lane partial results over the same strided loop, then a tree combine), since threads
of a row communicate. What only CUDA runs -- the shuffle butterfly and the shared-memory
step -- is checked by nvcc and, on a GPU, by tests/gpu/test_gpu.py.

    warp-row softmax over rows of 7 (CUDA):
      for (row = warp id; row < nrows; row += warps in grid)
        a0 = -inf; for (j = lane; j < 7; j += 32) a0 = max(a0, x[7*row + j])
        butterfly: a0 = max(a0, shfl_xor(a0, 16)), ... 1        (every lane holds the max)
        a1 = 0;    for (j = lane; ...) a1 += exp(x - r0);  butterfly
        for (j = lane; j < 7; j += 32) y[7*row + j] = exp(x - r0) * (1 / r1)
"""

from __future__ import annotations

from autoclust.backends.gpu import cstyle, split
from autoclust.backends.gpu.launch import Launch, buffer_dtypes, prod, vectorizable
from autoclust.backends.gpu.prelude import arg_suffix

from autoclust.kernel import ir as kir

# ArgMax/ArgMin keep a row's NaN only when it comes first (onnxruntime); float max/min
# propagate any NaN through cstyle.combine.
NAN_FIRST_KINDS = ("argmax", "argmin", "argmax_last", "argmin_last")
FULL_MASK = "0xffffffffu"
# Row kernels keep the row's values that several phases read (LayerNorm's x: the mean, the
# variance and the store) in registers: one sweep of loads, all in flight at once, instead
# of one sweep per phase (the later ones hit L1/L2 at best). Up to this many stashed
# elements per thread; 0 turns the stash off.
STASH_LIMIT = 32
TOKENS = {"cuda": ("threadIdx.x", "blockIdx.x", "blockDim.x", "gridDim.x"),
          "c": ("ac_tid", "ac_bid", "ac_block", "ac_grid")}


class KernelWriter:
    """Renders one (renumbered) kernel; `vector_types` collects the vector structs it uses."""

    def __init__(self, k: kir.Kernel, launch: Launch, target: str, name: str):
        self.k = k
        self.launch = launch
        self.cuda = target == "cuda"
        self.name = name
        self.tid, self.bid, self.bdim, self.gdim = TOKENS[target]
        self.ix = "long long" if launch.wide else "int"
        self.ux = "unsigned long long" if launch.wide else "unsigned"
        self.usuf = "ULL" if launch.wide else "u"
        self.dtypes = buffer_dtypes(k)
        self.n_outer = len(k.shape) - k.n_inner
        self.lines: list[str] = []
        self.vector_types: set[tuple[str, int]] = set()
        self._scopes = 0
        self.stash: dict[kir.Load, str] = {}  # row kernels: stashed load -> its array
        self.per_lane = 0                     # ... and each lane's elements of a row

    # ---- small pieces ------------------------------------------------------------------
    def emitter(self, indent: str, ivs: list[str], reduced: list[str],
                override=None) -> cstyle.ExprEmitter:
        self._scopes += 1
        return cstyle.ExprEmitter(self.lines, indent, ivs, reduced, self.dtypes, override,
                                  prefix=f"v{self._scopes}_")

    def decompose(self, var: str, dims: list[int], names: list[str], indent: str) -> None:
        """names[d] = digit d of `var` in the mixed radix `dims` (last fastest)."""
        if not dims:
            return
        rest = var
        for d in range(len(dims) - 1, 0, -1):
            radix = f"{max(dims[d], 1)}{self.usuf}"  # an empty dim never runs this code
            self.lines.append(f"{indent}const {self.ix} {names[d]} = ({self.ix})({rest} % "
                              f"{radix});")
            q = f"{names[d]}_q"
            self.lines.append(f"{indent}const {self.ux} {q} = {rest} / {radix};")
            rest = q
        self.lines.append(f"{indent}const {self.ix} {names[0]} = ({self.ix}){rest};")

    def signature(self) -> str:
        stored = {s.buf for s in self.k.stores}
        params = []
        for b in sorted(self.dtypes):
            const = "" if b in stored else "const "
            params.append(f"{const}{cstyle.storage(self.dtypes[b])}* __restrict__ b{b}")
        params.append("long long n0")
        if self.launch.strategy == "split-row":
            params.append(split.PARAM)
        if self.cuda:
            return (f'extern "C" __global__ void __launch_bounds__({self.launch.block}) '
                    f"{self.name}({', '.join(params)})")
        params += ["unsigned ac_grid", "unsigned ac_block"]
        return f"void {self.name}({', '.join(params)})"

    def _store_all(self, em: cstyle.ExprEmitter, stores) -> None:
        for s in stores:
            em.store(s, self.dtypes[s.buf])

    # ---- whole kernel --------------------------------------------------------------------
    def render(self) -> str:
        self.lines = [self.signature() + " {"]
        grid_loop = self.launch.strategy in ("elementwise", "vector", "scan")
        if grid_loop and not self.cuda:  # emulate the grid: every (block, thread) in turn
            self.lines.append("  for (unsigned ac_bid = 0; ac_bid < ac_grid; ac_bid++)")
            self.lines.append("  for (unsigned ac_tid = 0; ac_tid < ac_block; ac_tid++) {")
        body = {"elementwise": self._elementwise, "vector": self._vector, "scan": self._scan,
                "thread-row": self._rows, "warp-row": self._rows, "block-row": self._rows,
                "split-row": lambda: split.render_body(self)}
        body[self.launch.strategy]()
        if grid_loop and not self.cuda:
            self.lines.append("  }")
        self.lines.append("}")
        return "\n".join(self.lines) + "\n"

    def _grid_loop_head(self, var: str, start: str, limit: str) -> None:
        ux = self.ux
        self.lines.append(f"  for ({ux} {var} = {start}; {var} < {limit}; "
                          f"{var} += ({ux}){self.gdim} * {self.bdim}) {{")

    def _total(self) -> None:
        self.lines.append(f"  const {self.ux} total = ({self.ux})n0 * "
                          f"{self.launch.unit}{self.usuf};")

    def _first_item(self) -> str:
        return f"({self.ux}){self.bid} * {self.bdim} + {self.tid}"

    def _elementwise(self) -> None:
        k = self.k
        self._total()
        self._grid_loop_head("t", self._first_item(), "total")
        ivs = [f"i{d}" for d in range(len(k.shape))]
        self.decompose("t", list(k.shape), ivs, "    ")
        self._store_all(self.emitter("    ", ivs, []), k.stores)
        self.lines.append("  }")

    # ---- vector path --------------------------------------------------------------------
    def _vector(self) -> None:
        k, v = self.k, self.launch.vector
        rank = len(k.shape)
        loads = sorted({(e.buf, e.index) for e in kir.kernel_exprs(k) if isinstance(e, kir.Load)
                        and not e.clamps and not e.dyn and vectorizable(e.index, v)},
                       key=repr)
        stores = [s for s in k.stores if vectorizable(s.index, v)
                  and sum(1 for x in k.stores if x.buf == s.buf) == 1]
        self._total()
        self._alignment_check({b for b, _ in loads} | {s.buf for s in stores}, v)
        self.lines.append(f"  const {self.ux} nvec = aligned ? total / {v}{self.usuf} : 0;")
        self._grid_loop_head("q", self._first_item(), "nvec")
        base = [f"i{d}" for d in range(rank)]
        self.decompose(f"q * {v}{self.usuf}", list(k.shape), base, "    ")
        names = {}
        for n, (b, index) in enumerate(loads):
            names[(b, index)] = f"lv{n}"
            vt = self._vec_type(b, v)
            self.lines.append(f"    const {vt} lv{n} = *(const {vt}*)(b{b} + "
                              f"{cstyle.affine(index, base)});")
        for n, s in enumerate(stores):
            self.lines.append(f"    {self._vec_type(s.buf, v)} sv{n};")
        self.lines.append("    #pragma unroll")
        self.lines.append(f"    for (int l = 0; l < {v}; ++l) {{")
        lane_ivs = base[:-1] + [f"(i{rank - 1} + l)"]

        def override(e: kir.Load) -> str | None:
            name = names.get((e.buf, e.index)) if not e.clamps and not e.dyn else None
            return None if name is None else cstyle.from_storage(f"{name}.v[l]", e.dtype)

        em = self.emitter("      ", lane_ivs, [], override)
        for s in k.stores:
            if s in stores:
                value = em.value(s.expr)
                self.lines.append(f"      sv{stores.index(s)}.v[l] = "
                                  f"{cstyle.to_storage(value, self.dtypes[s.buf])};")
            else:
                em.store(s, self.dtypes[s.buf])
        self.lines.append("    }")
        for n, s in enumerate(stores):
            vt = self._vec_type(s.buf, v)
            self.lines.append(f"    *({vt}*)(b{s.buf} + {cstyle.affine(s.index, base)}) = sv{n};")
        self.lines.append("  }")
        # the tail (1-D kernels) or everything (unaligned operands), one element at a time
        self._grid_loop_head("t", f"nvec * {v}{self.usuf} + {self._first_item()}", "total")
        ivs = [f"i{d}" for d in range(rank)]
        self.decompose("t", list(k.shape), ivs, "    ")
        self._store_all(self.emitter("    ", ivs, []), k.stores)
        self.lines.append("  }")

    def _vec_type(self, buf: int, v: int) -> str:
        st = cstyle.storage(self.dtypes[buf])
        self.vector_types.add((st, v))
        return vector_type_name(st, v)

    def _alignment_check(self, bufs: set[int], v: int) -> None:
        terms = [f"((unsigned long long)b{b} & {v * cstyle.itemsize(self.dtypes[b]) - 1}ull)"
                 for b in sorted(bufs)]
        self.lines.append(f"  const int aligned = ({' | '.join(terms) or '0'}) == 0;")

    # ---- scan kernels --------------------------------------------------------------------
    def _scan(self) -> None:
        k = self.k
        red = k.reductions[0]
        inner = list(k.shape[self.n_outer:])
        n = prod(inner)
        self.lines.append(f"  const {self.ux} nrows = ({self.ux})n0 * "
                          f"{self.launch.unit}{self.usuf};")
        self._grid_loop_head("row", self._first_item(), "nrows")
        outer = [f"i{d}" for d in range(self.n_outer)]
        self.decompose("row", list(k.shape[:self.n_outer]), outer, "    ")
        acc_t = cstyle.compute(red.dtype)
        init = cstyle.reduce_init(red.kind, red.dtype)
        if red.kind == "sum" and cstyle.is_float(red.dtype):  # -0.0 unless exclusive
            init = cstyle.constant(kir.sum_start(red), red.dtype)
        self.lines.append(f"    {acc_t} acc = {init};")
        self.lines.append(f"    for ({self.ix} jj = 0; jj < {n}; jj++) {{")
        ivs = list(outer)
        if inner:
            pos = f"{n - 1} - jj" if red.reverse else "jj"
            self.lines.append(f"      const {self.ix} i{self.n_outer} = {pos};")
            ivs.append(f"i{self.n_outer}")
        em = self.emitter("      ", ivs, [])
        x = em.value(red.expr)
        exclusive = red.scan == "exclusive"
        if exclusive:  # the running value before this element
            self.lines.append(f"      const {acc_t} r0 = acc;")
        self.lines.append(f"      acc = {cstyle.combine(red.kind, red.dtype, 'acc', x)};")
        if not exclusive:
            self.lines.append(f"      const {acc_t} r0 = acc;")
        em.reduced = ["r0"]
        self._store_all(em, k.stores)
        self.lines.append("    }")
        self.lines.append("  }")

    # ---- row kernels ---------------------------------------------------------------------
    def _rows(self) -> None:
        k, launch = self.k, self.launch
        u, ux = self.usuf, self.ux
        self.lines.append(f"  const {ux} nrows = ({ux})n0 * {launch.unit}{u};")
        if not self.cuda:
            self.lines.append(f"  for ({ux} row = 0; row < nrows; row++) {{")
        elif launch.strategy == "warp-row":
            self.lines.append(f"  const unsigned lane = {self.tid} & 31u;")
            self.lines.append(f"  for ({ux} row = ({ux}){self.bid} * ({self.bdim} >> 5) + "
                              f"({self.tid} >> 5); row < nrows; row += ({ux}){self.gdim} * "
                              f"({self.bdim} >> 5)) {{")
        elif launch.strategy == "block-row":
            self.lines.append(f"  const unsigned lane = {self.tid};")
            for p, red in enumerate(k.reductions):
                for t, suffix in self._acc_parts(red):
                    self.lines.append(f"  __shared__ {t} s{p}{suffix}[32];")
            self.lines.append(f"  for ({ux} row = {self.bid}; row < nrows; "
                              f"row += {self.gdim}) {{")
        else:
            self.lines.append("  const unsigned lane = 0;")
            self._grid_loop_head("row", self._first_item(), "nrows")
        outer = [f"i{d}" for d in range(self.n_outer)]
        self.decompose("row", list(k.shape[:self.n_outer]), outer, "    ")
        self._stash_row(outer)
        reduced: list[str] = []
        for p, red in enumerate(k.reductions):
            reduced.append(self._phase(p, red, outer, reduced))
        self._row_stores(outer, reduced)
        self.lines.append("  }")

    def _acc_parts(self, red: kir.Reduction) -> list[tuple[str, str]]:
        return cstyle.accumulator(red)

    def _init(self, red: kir.Reduction) -> list[str]:
        return cstyle.accumulator_init(red)

    def emulate_lanes(self, p: int, red: kir.Reduction, lane_partial) -> None:
        """C target: run `lane_partial()` (which declares and fills a{p} for `lane`) once
        per emulated lane into partials p{p}[lane], then combine them as a tree into a{p}."""
        lanes = self.launch.lanes
        parts = self._acc_parts(red)
        for t, sfx in parts:
            self.lines.append(f"    {t} p{p}{sfx}[{lanes}];")
        self.lines.append(f"    for (unsigned lane = 0; lane < {lanes}u; lane++) {{")
        lane_partial()
        for _, sfx in parts:
            self.lines.append(f"      p{p}{sfx}[lane] = a{p}{sfx};")
        self.lines.append("    }")
        self.lines.append(f"    for (unsigned o = {lanes // 2}u; o > 0; o >>= 1)")
        self.lines.append("      for (unsigned l = 0; l < o; l++) {")
        self._tree_merge(p, red, "        ")
        self.lines.append("      }")
        for t, sfx in parts:
            self.lines.append(f"    {t} a{p}{sfx} = p{p}{sfx}[0];")

    def _inner_loop(self, lane: str, lanes: int, outer: list[str], reduced: list[str],
                    indent: str) -> tuple[cstyle.ExprEmitter, str]:
        """Open `for (j = lane; j < R; j += lanes)` with the inner indices decomposed.

        With a stash, the CUDA loop counts a lane's elements instead (t = 0 .. per_lane,
        unrolled): the stash arrays are then indexed by constants and stay in registers.
        The C target keeps the j loop and finds element j's slot from j."""
        inner = list(self.k.shape[self.n_outer:])
        n = prod(inner)
        if self.stash and self.cuda:
            self.lines.append(f"{indent}#pragma unroll")
            self.lines.append(f"{indent}for (int t = 0; t < {self.per_lane}; t++) {{")
            self.lines.append(f"{indent}  const {self.ix} j = ({self.ix}){lane} + "
                              f"({self.ix})t * {lanes};")
            self.lines.append(f"{indent}  if (j >= {n}) break;")
        else:
            step = "j++" if lanes == 1 else f"j += {lanes}"
            self.lines.append(f"{indent}for ({self.ix} j = {lane}; j < {n}; {step}) {{")
        names = [f"i{self.n_outer + d}" for d in range(len(inner))]
        self.decompose("j", inner, names, indent + "  ")
        return self.emitter(indent + "  ", outer + names, reduced, self._stashed_value), "j"

    def _stashed_value(self, e: kir.Load) -> str | None:
        """The register (CUDA) or array slot (C) holding load e's value at element j."""
        name = self.stash.get(e)
        if name is None:
            return None
        if self.cuda:
            return f"{name}[t]"
        lanes = self.launch.lanes
        return f"{name}[(j % {lanes}) * {self.per_lane} + j / {lanes}]"

    def _stash_plan(self) -> list[kir.Load]:
        """The loads worth stashing: read along the row by two or more of the phases and
        element stores, as many as fit STASH_LIMIT elements per thread."""
        k, launch = self.k, self.launch
        n = prod(list(k.shape[self.n_outer:]))
        if launch.strategy not in ("warp-row", "block-row") or n == 0:
            return []
        per_lane = -(-n // launch.lanes)
        uses: dict[kir.Load, int] = {}
        sites = [r.expr for r in k.reductions] + [s.expr for s in k.stores if not s.per_row]
        for site in sites:
            for e in {e for e in kir.walk([site]) if isinstance(e, kir.Load)}:
                along = any(e.index.coeffs[d] for d in range(self.n_outer, len(k.shape)))
                if along and not e.dyn:
                    uses[e] = uses.get(e, 0) + 1
        shared = sorted((e for e, c in uses.items() if c >= 2), key=lambda e: (-uses[e],
                                                                               repr(e)))
        return shared[:STASH_LIMIT // per_lane]

    def _stash_row(self, outer: list[str]) -> None:
        """Load the stashed values of the current row, each lane its elements j = lane +
        t * lanes (C: every emulated lane in turn, into slot lane * per_lane + t)."""
        loads = self._stash_plan()
        self.stash = {}
        if not loads:
            return
        k, lanes = self.k, self.launch.lanes
        inner = list(k.shape[self.n_outer:])
        n = prod(inner)
        self.per_lane = per = -(-n // lanes)
        names = [f"i{self.n_outer + d}" for d in range(len(inner))]
        size = per if self.cuda else per * lanes
        for m, e in enumerate(loads):
            self.lines.append(f"    {cstyle.compute(e.dtype)} st{m}[{size}];")
        if self.cuda:
            self.lines.append("    #pragma unroll")
            indent = "    "
        else:
            self.lines.append(f"    for (unsigned lane = 0; lane < {lanes}u; lane++)")
            indent = "    "
        self.lines.append(f"{indent}for (int t = 0; t < {per}; t++) {{")
        self.lines.append(f"{indent}  const {self.ix} j = ({self.ix})lane + ({self.ix})t * "
                          f"{lanes};")
        self.lines.append(f"{indent}  if (j >= {n}) break;")
        self.decompose("j", inner, names, indent + "  ")
        em = self.emitter(indent + "  ", outer + names, [])
        slot = "t" if self.cuda else f"lane * {per} + t"
        for m, e in enumerate(loads):
            self.lines.append(f"{indent}  st{m}[{slot}] = {em.value(e)};")
        self.lines.append(f"{indent}}}")
        self.stash = {e: f"st{m}" for m, e in enumerate(loads)}

    def _accumulate(self, red: kir.Reduction, acc: str, x: str, pos: str, indent: str) -> None:
        if red.kind.startswith("arg"):
            fn = f"ac_{red.kind}_{arg_suffix(red.expr.dtype)}"
            self.lines.append(f"{indent}{fn}(&{acc}v, &{acc}i, {x}, (long long){pos});")
        else:
            self.lines.append(f"{indent}{acc} = {cstyle.combine(red.kind, red.dtype, acc, x)};")

    def _merge(self, red: kir.Reduction, acc: str, other: str, indent: str) -> None:
        """acc = combine(acc, other) for two partial results (arrays or variables)."""
        if red.kind.startswith("arg"):
            fn = f"ac_{red.kind}_{arg_suffix(red.expr.dtype)}"
            self.lines.append(f"{indent}{fn}(&{acc}v, &{acc}i, {other}v, {other}i);")
        else:
            self.lines.append(
                f"{indent}{acc} = {cstyle.combine(red.kind, red.dtype, acc, other)};")

    def _phase(self, p: int, red: kir.Reduction, outer: list[str], reduced: list[str]) -> str:
        """Emit reduction phase p for the current row; returns the variable of its result."""
        lanes = self.launch.lanes
        acc = f"a{p}"
        if not self.cuda and lanes > 1:
            self.emulate_lanes(p, red, lambda: self._lane_partial(
                p, red, "lane", lanes, outer, reduced, "      "))
        else:
            lane = "lane" if self.cuda else "0"
            self._lane_partial(p, red, lane, lanes, outer, reduced, "    ")
            if self.cuda and lanes > 1:
                self._cross_lane(p, red, acc)
        return self._finish_phase(p, red, acc, outer, reduced)

    def _tree_merge(self, p: int, red: kir.Reduction, indent: str) -> None:
        """partial[l] = combine(partial[l], partial[l + o]): one level of the lane tree."""
        if red.kind.startswith("arg"):
            fn = f"ac_{red.kind}_{arg_suffix(red.expr.dtype)}"
            self.lines.append(f"{indent}{fn}(&p{p}v[l], &p{p}i[l], p{p}v[l + o], "
                              f"p{p}i[l + o]);")
        else:
            both = cstyle.combine(red.kind, red.dtype, f"p{p}[l]", f"p{p}[l + o]")
            self.lines.append(f"{indent}p{p}[l] = {both};")

    def _lane_partial(self, p: int, red: kir.Reduction, lane: str, lanes: int,
                      outer: list[str], reduced: list[str], indent: str) -> None:
        """Declare accumulator a{p} and fold this lane's elements of the row into it."""
        for (t, sfx), init in zip(self._acc_parts(red), self._init(red)):
            self.lines.append(f"{indent}{t} a{p}{sfx} = {init};")
        em, j = self._inner_loop(lane, lanes, outer, reduced, indent)
        x = em.value(red.expr)
        self._accumulate(red, f"a{p}", x, j, indent + "  ")
        self.lines.append(f"{indent}}}")

    def _shuffle_merge(self, red: kir.Reduction, acc: str, indent: str) -> None:
        """Butterfly over the 32 lanes of a warp: afterwards every lane holds the result."""
        self.lines.append(f"{indent}for (int sh = 16; sh > 0; sh >>= 1) {{")
        for t, sfx in self._acc_parts(red):
            self.lines.append(f"{indent}  const {t} o{sfx} = __shfl_xor_sync({FULL_MASK}, "
                              f"{acc}{sfx}, sh);")
        self._merge(red, acc, "o", indent + "  ")
        self.lines.append(f"{indent}}}")

    def _cross_lane(self, p: int, red: kir.Reduction, acc: str) -> None:
        self._shuffle_merge(red, acc, "    ")
        if self.launch.strategy not in ("block-row", "split-row"):
            return
        parts = self._acc_parts(red)
        self.lines.append("    if ((lane & 31u) == 0) {")
        for _, sfx in parts:
            self.lines.append(f"      s{p}{sfx}[lane >> 5] = {acc}{sfx};")
        self.lines.append("    }")
        self.lines.append("    __syncthreads();")
        self.lines.append("    if (lane < 32u) {")
        for (_, sfx), init in zip(parts, self._init(red)):
            self.lines.append(f"      {acc}{sfx} = lane < ({self.bdim} >> 5) ? "
                              f"s{p}{sfx}[lane] : {init};")
        self._shuffle_merge(red, acc, "      ")
        self.lines.append("      if (lane == 0) {")
        for _, sfx in parts:
            self.lines.append(f"        s{p}{sfx}[0] = {acc}{sfx};")
        self.lines.append("      }")
        self.lines.append("    }")
        self.lines.append("    __syncthreads();")
        for _, sfx in parts:
            self.lines.append(f"    {acc}{sfx} = s{p}{sfx}[0];")
        self.lines.append("    __syncthreads();  /* s is rewritten by the next row */")

    def _finish_phase(self, p: int, red: kir.Reduction, acc: str, outer: list[str],
                      reduced: list[str]) -> str:
        """onnxruntime's first-NaN rule, then the phase's result variable r{p}."""
        arg = red.kind.startswith("arg")
        inner_n = prod(list(self.k.shape[self.n_outer:]))
        if red.kind in NAN_FIRST_KINDS and cstyle.is_float(red.expr.dtype) and inner_n > 0:
            self.lines.append("    {  /* a NaN first in its row wins (onnxruntime) */")
            em = self.emitter("      ", outer + ["0"] * self.k.n_inner, reduced)
            first = em.value(red.expr)
            fix = f"{acc}i = 0;" if arg else f"{acc} = {first};"
            self.lines.append(f"      if ({first} != {first}) {{ {fix} }}")
            self.lines.append("    }")
        if arg:
            self.lines.append(f"    const long long r{p} = {acc}i < 0 ? 0 : {acc}i;")
        else:
            self.lines.append(f"    const {cstyle.compute(red.dtype)} r{p} = {acc};")
        return f"r{p}"

    def _row_stores(self, outer: list[str], reduced: list[str]) -> None:
        k = self.k
        per_row = [s for s in k.stores if s.per_row]
        elem = [s for s in k.stores if not s.per_row]
        if per_row:
            guard = self.cuda and self.launch.lanes > 1
            indent = "      " if guard else "    "
            if guard:
                self.lines.append("    if (lane == 0) {")
            em = self.emitter(indent, outer + ["0"] * k.n_inner, reduced)
            self._store_all(em, per_row)
            if guard:
                self.lines.append("    }")
        if elem:
            lanes = self.launch.lanes if self.cuda else 1
            lane = "lane" if self.cuda else "0"
            em, _ = self._inner_loop(lane, lanes, outer, reduced, "    ")
            self._store_all(em, elem)
            self.lines.append("    }")


# storage C type -> (vector struct name tag, bytes per element)
VECTOR_TAGS = {"float": ("f", 4), "double": ("d", 8), "unsigned short": ("h", 2),
               "int": ("i32", 4), "long long": ("i64", 8), "unsigned char": ("u8", 1),
               "signed char": ("i8", 1), "short": ("i16", 2)}


def vector_type_name(storage: str, v: int) -> str:
    return f"ac_v{v}_{VECTOR_TAGS[storage][0]}"


def vector_typedef(storage: str, v: int) -> str:
    """A struct of v elements aligned to its size: loads and stores of it are vector ops."""
    size = v * VECTOR_TAGS[storage][1]
    return (f"typedef struct AC_ALIGN({size}) {{ {storage} v[{v}]; }} "
            f"{vector_type_name(storage, v)};\n")


def render_kernel(k: kir.Kernel, launch: Launch, target: str, name: str
                  ) -> tuple[str, set[tuple[str, int]]]:
    """(source of kernel k as function `name`, the vector struct types it uses)."""
    w = KernelWriter(k, launch, target, name)
    text = w.render()
    return text, w.vector_types


# ---- check kernels ---------------------------------------------------------------------

def check_name(kind: str, dtype: str) -> str:
    return f"ac_check_{kind}_{dtype}"


def render_check(kind: str, dtype: str, target: str) -> str:
    """A kernel setting flags[slot] when an element of b[start::stride][:n] is out of
    [lo, hi] ("range") or zero ("nonzero")."""
    t = cstyle.storage(dtype)
    bad = "v < lo || v > hi" if kind == "range" else "v == 0"
    params = (f"const {t}* __restrict__ b, long long n, long long start, long long stride, "
              "long long lo, long long hi, int* __restrict__ flags, int slot")
    tid, bid, bdim, gdim = TOKENS[target]
    lines = []
    if target == "cuda":
        lines.append(f'extern "C" __global__ void {check_name(kind, dtype)}({params}) {{')
    else:
        lines.append(f"void {check_name(kind, dtype)}({params}, unsigned ac_grid, "
                     "unsigned ac_block) {")
        lines.append("  for (unsigned ac_bid = 0; ac_bid < ac_grid; ac_bid++)")
        lines.append("  for (unsigned ac_tid = 0; ac_tid < ac_block; ac_tid++) {")
    lines.append(f"  for (long long t = (long long){bid} * {bdim} + {tid}; t < n; "
                 f"t += (long long){gdim} * {bdim}) {{")
    lines.append("    const long long v = (long long)b[start + t * stride];")
    lines.append(f"    if ({bad}) flags[slot] = 1;")
    lines.append("  }")
    if target != "cuda":
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"
