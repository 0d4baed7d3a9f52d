"""GraphCycles (Pearce-Kelly) against brute-force reachability on random graphs."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoclust.clustering.graph_cycles import GraphCycles


def _reach(adj: dict[int, set[int]], x: int, y: int, skip: tuple[int, int] | None = None) -> bool:
    """Brute force: is there a path x -> ... -> y (ignoring the edge `skip`)?"""
    seen, stack = {x}, [x]
    while stack:
        n = stack.pop()
        for m in adj[n]:
            if (n, m) == skip:
                continue
            if m == y:
                return True
            if m not in seen:
                seen.add(m)
                stack.append(m)
    return x == y and skip is None


def _adjacency(gc: GraphCycles) -> dict[int, set[int]]:
    return {i: set(gc.out[i]) for i in range(len(gc.rank)) if gc.alive[i]}


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 10).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)),
                         max_size=40))))
def test_insert_edge_matches_brute_force(case):
    n, edges = case
    gc = GraphCycles(n)
    adj: dict[int, set[int]] = {i: set() for i in range(n)}
    for x, y in edges:
        would_cycle = x == y or _reach(adj, y, x)
        assert gc.insert_edge(x, y) == (not would_cycle), (x, y, adj)
        if not would_cycle:
            adj[x].add(y)
        gc.check_invariant()
        assert _adjacency(gc) == adj
    for x in range(n):
        for y in range(n):
            assert gc.is_reachable(x, y) == (x == y or _reach(adj, x, y)), (x, y)


def _random_dag(rng: random.Random, n: int, p: float) -> GraphCycles:
    # Edges inserted in a shuffled order so Pearce-Kelly has to reorder ranks.
    edges = [(a, b) for a in range(n) for b in range(a + 1, n) if rng.random() < p]
    rng.shuffle(edges)
    perm = list(range(n))
    rng.shuffle(perm)  # node ids unrelated to the topological order
    gc = GraphCycles(n)
    for a, b in edges:
        assert gc.insert_edge(perm[a], perm[b])
    return gc


@pytest.mark.parametrize("seed", range(40))
def test_contract_edge_refuses_exactly_when_a_longer_path_exists(seed):
    rng = random.Random(seed)
    gc = _random_dag(rng, rng.randint(3, 12), rng.choice([0.2, 0.4, 0.6]))
    for _ in range(12):
        adj = _adjacency(gc)
        edges = sorted((a, b) for a, succ in adj.items() for b in succ)
        if not edges:
            break
        a, b = rng.choice(edges)
        longer_path = _reach(adj, a, b, skip=(a, b))
        assert gc.contract_edge(a, b) == (not longer_path), (a, b, adj)
        gc.check_invariant()
        if longer_path:
            assert _adjacency(gc) == adj  # a refusal changes nothing
            path = gc.find_path(a, b, skip_direct=True)
            assert len(path) >= 3 and path[0] == a and path[-1] == b
            assert all(q in adj[p] for p, q in itertools.pairwise(path))
            continue
        # The merged graph: b's edges now belong to a, minus the contracted edge.
        expected = {k: {a if m == b else m for m in v} - {k} for k, v in adj.items() if k != b}
        expected[a] |= {m for m in adj[b]}
        assert _adjacency(gc) == expected
        for x in expected:
            for y in expected:
                assert gc.is_reachable(x, y) == (x == y or _reach(expected, x, y))


@pytest.mark.parametrize("seed", range(20))
def test_contract_nodes_merges_unrelated_nodes_only(seed):
    rng = random.Random(1000 + seed)
    gc = _random_dag(rng, rng.randint(3, 10), 0.3)
    adj = _adjacency(gc)
    a, b = rng.sample(sorted(adj), 2)
    direct = b in adj[a] or a in adj[b]
    legal = not (_reach(adj, a, b, skip=(a, b)) or _reach(adj, b, a, skip=(b, a)))
    assert gc.contract_nodes(a, b) == legal, (a, b, adj, direct)
    gc.check_invariant()
    assert not gc.alive[b] if legal else gc.alive[b]


def test_contract_edge_needs_an_edge_and_insert_edge_refuses_self_loops():
    gc = GraphCycles(3)
    assert gc.insert_edge(0, 1) and gc.insert_edge(1, 2)
    assert not gc.insert_edge(1, 1)
    assert not gc.insert_edge(2, 0)  # closes 0 -> 1 -> 2 -> 0
    with pytest.raises(ValueError, match="no edge 0 -> 2"):
        gc.contract_edge(0, 2)
    assert gc.insert_edge(0, 2)
    assert not gc.contract_edge(0, 2)  # 0 -> 1 -> 2 is a longer path
    assert gc.find_path(0, 2, skip_direct=True) == [0, 1, 2]
    assert gc.contract_edge(0, 1)  # merged node {0,1} keeps the edge to 2
    assert gc.has_edge(0, 2) and gc.contract_edge(0, 2)
    assert gc.successors(0) == [] and not gc.alive[1] and not gc.alive[2]


def test_new_node_is_ranked_last():
    gc = GraphCycles(2)
    assert gc.insert_edge(1, 0)
    c = gc.new_node()
    assert c == 2 and gc.insert_edge(0, c) and gc.is_reachable(1, c)
    gc.check_invariant()
