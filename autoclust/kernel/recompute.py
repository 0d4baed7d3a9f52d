"""What fusion stores instead of recomputing (rule 4 of fusion.py).

An inlined value is recomputed wherever a kernel reads it. That is free for cheap index
arithmetic and ruinous for a reduction, a chain that re-reads several tensors, or a
transcendental evaluated once per element of a much larger loop nest. `too_costly`
names the inlined values of a fusion round to materialize before the next round.
"""

from __future__ import annotations

from autoclust import ops, symbolic
from autoclust.ir import Graph, Value

RECOMPUTE_LIMIT = 12       # cost units a second kernel may recompute instead of a load
LOAD_COST = 4              # cost units of reading one more tensor while recomputing
BROADCAST_RECOMPUTE = 4    # times per element one kernel may recompute a value costing ...
BROADCAST_MIN_COST = 4     # ... this many op cost units (one transcendental) or more


def cost(v: Value, materialized: set[str], graph: Graph) -> int:
    """Cost units recomputed when `v` is inlined (a reduction counts as unbounded): its ops'
    costs plus LOAD_COST per tensor it reads. A recomputed chain that reads several
    tensors re-reads them all in every reader, in every phase of a row kernel: GPT-2's
    residual stream (embedding Gather + one Add per layer) was recomputed in each
    layer's LayerNorm, reading up to 8 tensors three times per row."""
    total, stack, seen, reads = 0, [v], set(), set()
    while stack:
        w = stack.pop()
        if w.name in seen:
            continue
        seen.add(w.name)
        if w.name in materialized or w.producer is None:
            const = graph.constant_value(w)
            if const is None or const.size > 1:  # a scalar constant is inlined, not read
                reads.add(w.name)
            continue
        node = w.producer
        opdef = ops.get(node.op, node.domain)
        if opdef is None or opdef.kind in (ops.REDUCTION, ops.NORMALIZATION):
            return RECOMPUTE_LIMIT + 1
        total += opdef.cost
        stack += node.all_inputs()
    return total + LOAD_COST * len(reads)


def transcendental(v: Value, materialized: set[str], graph: Graph) -> bool:
    """Whether inlined `v` computes an op costing BROADCAST_MIN_COST or more (exp, cos,
    erf, ...) and no reduction: a reduction inlined into a row kernel is a phase computed
    once a row, and cheap index arithmetic (a causal mask's compare) costs less than the
    load of a stored table."""
    stack, seen, costly = [v], set(), False
    while stack:
        w = stack.pop()
        if w.name in seen or w.name in materialized or w.producer is None:
            continue
        seen.add(w.name)
        opdef = ops.get(w.producer.op, w.producer.domain)
        if opdef is None or opdef.kind in (ops.REDUCTION, ops.NORMALIZATION):
            return False
        costly = costly or opdef.cost >= BROADCAST_MIN_COST
        stack += w.producer.all_inputs()
    return costly


def too_costly(groups: list, graph: Graph, materialized: set[str]) -> list[Value]:
    """Inlined values recomputed at a high cost, to materialize together: those several
    kernels recompute, and those one kernel recomputes BROADCAST_RECOMPUTE or more times
    per element (a loop nest that many times their size: LLaMA's cos/sin tables over
    [seq, head_dim] inlined into the rotary kernel over [batch, heads, seq, head_dim]
    computed cos and sin for every head). In graph order, each judged as if the earlier
    ones were stored already (a residual chain then needs one or two fusion rounds, not
    one per layer). Sizes are compared at the symbolic dims' hints, recording no guard:
    either answer computes the same values."""
    readers: dict[str, int] = {}
    broadcast: set[str] = set()
    for g in groups:
        if g.builder is not None:
            loop = symbolic.hint(symbolic.product(g.builder.shape))
            for name in g.builder.inlined:
                readers[name] = readers.get(name, 0) + 1
                shape = graph.values[name].shape or ()
                size = symbolic.hint(symbolic.product(shape))
                if size and loop >= BROADCAST_RECOMPUTE * size:
                    broadcast.add(name)
    order = {v.name: i for i, n in enumerate(graph.nodes) for v in n.outputs}
    shared = sorted((n for n, c in readers.items() if c > 1 or n in broadcast),
                    key=lambda n: order[n])
    stored = set(materialized)
    picked = []
    for name in shared:
        v = graph.values[name]
        if cost(v, stored, graph) > RECOMPUTE_LIMIT and readers[name] > 1 or \
                name in broadcast and transcendental(v, stored, graph):
            picked.append(v)
            stored.add(name)
    return picked
