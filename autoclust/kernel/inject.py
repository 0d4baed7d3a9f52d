"""Testing-only fault injection (--inject_bug), like inductor's inject_relu_bug_TESTING_ONLY.

    AUTOCLUST_FLAGS="--inject_bug=accuracy:Add"       # the target's compiled result is wrong
    AUTOCLUST_FLAGS="--inject_bug=compile_error:Add"  # compiling its cluster raises CompileError
    AUTOCLUST_FLAGS="--inject_bug=crash:Add"          # its compiled code aborts (llvm.trap)

It exists to test the debugging tools (bisect, minify, check_numerics) end to end against a
bug whose place is known. The lowering calls `apply(node, expr, graph)` for every node it
lowers to a kernel expression; without the flag that is one context-variable read.

The target, per compiled cluster: the first node of op OP in the cluster graph fusion
lowers (after specialization and the cluster optimizer), in that graph's node order: the
model's own node order restricted to the cluster, minus what the optimizer removed. A node
a pass creates counts where it stands (simplify turns Pow(x, 2) into a Mul, which can be
the first Mul: bisect then names the Pow). The order comes from the model file and our
deterministic passes, never from hashing, so every process picks the same node. Only nodes
lowered into a loop kernel can be targets: an OP whose first node runs as a library call
(MatMul, Gemm, Conv) or a reference call gets no fault in that cluster.

The flags reach the lowering through `active(flags)`, a context the runtime (and replay)
enter around each compile, because fusion.fuse() takes no flags today.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections.abc import Iterator

from autoclust.errors import CompileError, FlagError
from autoclust.ir import Graph, Node
from autoclust.kernel import ir as kir

KINDS = ("accuracy", "compile_error", "crash")

_ACTIVE: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "autoclust_inject_bug", default=None)
# cluster graph -> name of its target node (a graph is lowered many times per compile)
_TARGETS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def parse(spec: str) -> tuple[str, str] | None:
    """(kind, op) from 'KIND:OP'; None for ''; FlagError for anything else."""
    if not spec:
        return None
    kind, sep, op = spec.partition(":")
    if not sep or kind not in KINDS or not op.strip():
        raise FlagError(f"--inject_bug={spec!r}: expected KIND:OP with KIND one of "
                        f"{', '.join(KINDS)} and OP an ONNX op type (e.g. accuracy:Add)")
    return kind, op.strip()


@contextlib.contextmanager
def active(flags: object) -> Iterator[None]:
    """Make flags.inject_bug apply to the compiles inside this context."""
    token = _ACTIVE.set(parse(getattr(flags, "inject_bug", "")))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def target(graph: Graph, op: str) -> str | None:
    """The name of the node the fault goes into: the first node of `op` in graph order."""
    cached = _TARGETS.get(graph)
    if cached is None or cached[0] != op:
        cached = (op, next((n.name for n in graph.nodes if n.op == op), None))
        _TARGETS[graph] = cached
    return cached[1]


def apply(node: Node, expr: kir.Expr, graph: Graph) -> kir.Expr:
    """`expr`, node's lowered expression, with the active fault put in when node is the target."""
    bug = _ACTIVE.get()
    if bug is None:
        return expr
    kind, op = bug
    if node.op != op or target(graph, op) != node.name:
        return expr
    if kind == "compile_error":
        raise CompileError(f"--inject_bug={kind}:{op}: injected compile error at node "
                           f"{node.name!r} ({node.op}) of {graph.name}")
    if kind == "crash":
        return kir.Op("trap", (expr,), expr.dtype)
    return wrong(expr)


def wrong(expr: kir.Expr) -> kir.Expr:
    """A visibly wrong expr: x + 0.5|x| + 1 (floats), x + 1 (ints), not x (bools).

    Not affine on purpose: LayerNorm and Softmax undo any a*x + b of a whole row (BERT's
    first Add feeds a LayerNorm, and x * 1.5 + 1 there changed the outputs by 4e-6).
    """
    dt = expr.dtype
    if dt == "bool":
        return kir.Op("not", (expr,), dt)
    if dt.startswith("float"):
        bend = kir.Op("mul", (kir.Op("abs", (expr,), dt), kir.Const(0.5, dt)), dt)
        return kir.Op("add", (kir.Op("add", (expr, bend), dt), kir.Const(1.0, dt)), dt)
    return kir.Op("add", (expr, kir.Const(1, dt)), dt)
