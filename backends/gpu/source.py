"""A kernel IR Program -> one source module (CUDA C or host C) and how to launch each kernel.

    rendered = render_program(program, "cuda")
    rendered.source                  # prelude + vector structs + check kernels + kernels
    rendered.kernels["k3"]           # KernelEntry: symbol, Launch, buffer ids in arg order

Each distinct kernel code (Program.sharing: a model's repeated layers) is rendered once,
under a symbol named after a hash of its code and launch, so identical kernels of several
programs can share one module (tests and `autoclust compile` compile a batch with one nvcc
call). The launch is chosen for the largest outer extent among the kernels sharing it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

from autoclust.backends.gpu import attention, attention_mma, conv, cstyle, kernels, prelude
from autoclust.backends.gpu.launch import BLOCKS_PER_SM, Launch, choose

from autoclust.kernel import ir as kir
from autoclust.kernel.passes import code_key, distinct_kernels


@dataclasses.dataclass(frozen=True)
class KernelEntry:
    name: str                 # the program's kernel (k3)
    symbol: str               # the function in the module
    launch: Launch
    args: tuple[int, ...]     # buffer ids in parameter order (then n0)


@dataclasses.dataclass(frozen=True)
class CallEntry:
    """A library call rendered as a kernel of the module (fused attention)."""

    symbol: str
    block: int                # threads per block
    items: int                # work items (one block each per grid-stride step)
    args: tuple[int, ...]     # buffer ids in parameter order

    def grid(self, sm_count: int) -> int:
        """Blocks to launch: one per work item, capped at BLOCKS_PER_SM per SM."""
        return max(1, min(self.items, BLOCKS_PER_SM * max(sm_count, 1)))


@dataclasses.dataclass
class Rendered:
    target: str
    kernels: dict[str, KernelEntry]
    checks: dict[int, str]                     # thunk position -> check kernel symbol
    bodies: dict[str, str]                     # symbol -> function text
    vector_types: set[tuple[str, int]]
    check_kinds: set[tuple[str, str]]
    calls: dict[int, CallEntry] = dataclasses.field(default_factory=dict)  # thunk position

    @property
    def source(self) -> str:
        return module_source([self])

    def launch_text(self, program: kir.Program) -> str:
        """The launch section of `.kernels.txt`: one line per kernel."""
        lines = ["GPU launches:"]
        for t in program.thunks:
            if isinstance(t, kir.Kernel):
                e = self.kernels[t.name]
                n_outer = len(t.shape) - t.n_inner
                dom = f"{list(t.shape[:n_outer])} | {list(t.shape[n_outer:])}" if t.n_inner \
                    else f"{list(t.shape)}"
                skip = " (empty: not launched)" if t.empty else ""
                lines.append(f"  {t.name} -> {e.symbol} {dom}: {e.launch.describe()}{skip}")
        return "\n".join(lines) + "\n"


def render_program(program: kir.Program, target: str,
                   choose_launch: Callable[[kir.Kernel, int], Launch] = choose,
                   mma_attention: bool = False) -> Rendered:
    """Render every kernel and check of `program` for target "cuda" or "c" (tests pass
    their own choose_launch to force each strategy); mma_attention: --gpu_mma_attention."""
    users: dict[str, list[kir.Kernel]] = {}
    for t in program.thunks:
        if isinstance(t, kir.Kernel):
            users.setdefault(program.sharing[t.name][0], []).append(t)
    symbols: dict[str, tuple[str, Launch]] = {}
    bodies: dict[str, str] = {}
    vtypes: set[tuple[str, int]] = set()
    for d in distinct_kernels(program):
        n0_max = max((t.shape[0] for t in users.get(d.name, [d]) if t.shape), default=1)
        launch = choose_launch(d, max(n0_max, 1))
        digest = hashlib.sha1(f"{code_key(d)}|{launch}".encode()).hexdigest()[:16]
        symbol = f"k_{digest}"
        symbols[d.name] = (symbol, launch)
        if symbol not in bodies:
            text, used = kernels.render_kernel(d, launch, target, symbol)
            bodies[symbol] = text
            vtypes |= used
    entries = {}
    for t in program.thunks:
        if isinstance(t, kir.Kernel):
            owner, ids = program.sharing[t.name]
            symbol, launch = symbols[owner]
            entries[t.name] = KernelEntry(t.name, symbol, launch, tuple(ids))
    calls = _render_calls(program, target, bodies, mma_attention)
    checks, kinds = {}, set()
    dtypes = {b.id: b.dtype for b in program.buffers}
    for i, t in enumerate(program.thunks):
        if isinstance(t, kir.Check):
            kinds.add((t.kind, dtypes[t.buf]))
            checks[i] = kernels.check_name(t.kind, dtypes[t.buf])
    return Rendered(target, entries, checks, bodies, vtypes, kinds, calls)


def _render_calls(program: kir.Program, target: str, bodies: dict[str, str],
                  mma_attention: bool) -> dict[int, CallEntry]:
    """The library calls this renderer turns into kernels of the module (FusedAttention;
    Conv's im2col), their text added to `bodies`."""
    buffers = {b.id: b for b in program.buffers}
    mma = mma_attention and (target == "c" or attention_mma.supported_here())
    calls = {}
    for i, t in enumerate(program.thunks):
        if not isinstance(t, kir.LibraryCall) or t.op not in (attention.attn.OP, "Conv"):
            continue
        kind = attention if t.op == attention.attn.OP else conv
        s = attention.spec(t, buffers, mma) if kind is attention else conv.spec(t, buffers)
        symbol = kind.symbol(s)
        if symbol not in bodies:
            bodies[symbol] = kind.render(s, target, symbol)
        ids = tuple(b for b in t.inputs if b is not None) + tuple(t.outputs)
        items = s.items if kind is attention else conv.items(s)
        calls[i] = CallEntry(symbol, kind.BLOCK, items, ids)
    return calls


def module_source(parts: list[Rendered]) -> str:
    """One module holding every kernel of `parts` (all of one target), each once."""
    target = parts[0].target
    bodies: dict[str, str] = {}
    vtypes: set[tuple[str, int]] = set()
    kinds: set[tuple[str, str]] = set()
    for r in parts:
        bodies.update(r.bodies)
        vtypes |= r.vector_types
        kinds |= r.check_kinds
    out = [f"/* autoclust GPU renderer, target {target} */\n", prelude.prelude(target)]
    out += [kernels.vector_typedef(st, v) for st, v in sorted(vtypes)]
    out += [kernels.render_check(kind, dt, target) for kind, dt in sorted(kinds)]
    out += [bodies[s] for s in sorted(bodies)]
    return "\n".join(out)


def check_args(t: kir.Check, size: int) -> tuple[int, int, int]:
    """(count, start, stride) of the elements a Check thunk looks at in a buffer of `size`."""
    start, stride = (t.column if t.column is not None else (0, 1))
    count = len(range(start, size, stride))
    return count, start, stride


__all__ = ["CallEntry", "KernelEntry", "Rendered", "check_args", "cstyle", "module_source", "render_program"]
