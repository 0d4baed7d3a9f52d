"""Incremental cycle detection for clustering: a DAG that stays a DAG under edits.

This is the structure TensorFlow's MarkForCompilationPass uses (GraphCycles), after
Pearce and Kelly, "A dynamic topological sort algorithm for directed acyclic graphs"
(JEA 2007).

Invariant: every live node x has a distinct integer `rank[x]`, and for every edge x -> y,
rank[x] < rank[y]; the ranks are a topological order of the current graph.

- `insert_edge(x, y)` with rank[x] < rank[y] keeps the invariant for free. Otherwise the
  only nodes out of order are those reachable from y with rank < rank[x] (delta_f) and
  those reaching x with rank > rank[y] (delta_b); if x is in delta_f the edge would close
  a cycle and is refused. Else the union of their old ranks is handed out again, all of
  delta_b first, then all of delta_f, each in its old relative order. Nodes outside the
  two sets keep their ranks, so the work is bounded by the affected region.
- `is_reachable(x, y)` only searches forward from x through nodes with rank <= rank[y]:
  a path to y cannot leave that window.
- `contract_edge(a, b)` merges b into a. Why it is safe: after removing the edge a -> b,
  if b is still reachable from a there is a path a -> ... -> b of length >= 2 through
  some node z, and merging would make the cycle {a,b} -> z -> {a,b}: refused. Otherwise
  moving b's edges onto a cannot close a cycle: a new cycle through the merged node would
  need a path from a to a predecessor of b (that is a path a -> b, excluded) or from a
  successor of b back to a (that is a path b -> a, impossible with the edge a -> b in a
  DAG). So every re-inserted edge succeeds and the invariant holds.
- `contract_nodes(a, b)` generalizes this to nodes that need not be adjacent: it merges
  them when neither reaches the other except by a direct edge.
"""

from __future__ import annotations


class GraphCycles:
    """A DAG on integer nodes that refuses edges and contractions that would form a cycle."""

    def __init__(self, num_nodes: int = 0):
        self.rank: list[int] = list(range(num_nodes))
        self.out: list[set[int]] = [set() for _ in range(num_nodes)]
        self.inn: list[set[int]] = [set() for _ in range(num_nodes)]
        self.alive: list[bool] = [True] * num_nodes
        self._mark: list[int] = [0] * num_nodes  # visit stamps, so searches never clear flags
        self._stamp = 0

    # ---- nodes and edges --------------------------------------------------------------
    def new_node(self) -> int:
        """Add an isolated node (ranked after every other) and return its id."""
        node = len(self.rank)
        self.rank.append(max(self.rank, default=-1) + 1)
        self.out.append(set())
        self.inn.append(set())
        self.alive.append(True)
        self._mark.append(0)
        return node

    def has_edge(self, x: int, y: int) -> bool:
        """True when the edge x -> y exists."""
        return y in self.out[x]

    def successors(self, x: int) -> list[int]:
        """Successors of x, sorted (deterministic)."""
        return sorted(self.out[x])

    def predecessors(self, x: int) -> list[int]:
        """Predecessors of x, sorted (deterministic)."""
        return sorted(self.inn[x])

    def insert_edge(self, x: int, y: int) -> bool:
        """Add x -> y; False (and no change) when it would create a cycle."""
        if x == y:
            return False
        if y in self.out[x]:
            return True
        self.out[x].add(y)
        self.inn[y].add(x)
        rank = self.rank
        if rank[x] < rank[y]:
            return True
        # y is ranked before x: find the affected region and reorder it.
        delta_f = self._search(y, rank[x], forward=True, stop=x)
        if delta_f is None:
            self.out[x].discard(y)
            self.inn[y].discard(x)
            return False
        delta_b = self._search(x, rank[y], forward=False, stop=None)
        assert delta_b is not None
        self._reorder(delta_b, delta_f)
        return True

    def remove_edge(self, x: int, y: int) -> None:
        """Remove x -> y when present (removing edges never breaks the order)."""
        self.out[x].discard(y)
        self.inn[y].discard(x)

    # ---- queries ------------------------------------------------------------------------
    def is_reachable(self, x: int, y: int) -> bool:
        """True when there is a path x -> ... -> y (x reaches itself)."""
        if x == y:
            return True
        if self.rank[x] > self.rank[y]:
            return False
        return self._search(x, self.rank[y], forward=True, stop=y) is None

    def find_path(self, x: int, y: int, skip_direct: bool = False) -> list[int]:
        """A path x -> ... -> y as a list of nodes ([] when none); `skip_direct` ignores
        the edge x -> y itself, so the path found has length >= 2."""
        if self.rank[x] > self.rank[y]:
            return []
        bound = self.rank[y]
        self._stamp += 1
        mark, stamp, rank = self._mark, self._stamp, self.rank
        parent = {x: -1}
        stack = [x]
        mark[x] = stamp
        while stack:
            node = stack.pop()
            for nxt in sorted(self.out[node]):
                if skip_direct and node == x and nxt == y:
                    continue
                if nxt == y:
                    path = [y, node]
                    while parent[path[-1]] != -1:
                        path.append(parent[path[-1]])
                    return path[::-1]
                if mark[nxt] != stamp and rank[nxt] < bound:
                    mark[nxt] = stamp
                    parent[nxt] = node
                    stack.append(nxt)
        return []

    # ---- contraction --------------------------------------------------------------------
    def contract_edge(self, a: int, b: int) -> bool:
        """Merge b into a along the edge a -> b; False when another path a -> b exists."""
        if b not in self.out[a]:
            raise ValueError(f"contract_edge({a}, {b}): there is no edge {a} -> {b}")
        return self.contract_nodes(a, b)

    def contract_nodes(self, a: int, b: int) -> bool:
        """Merge b into a when the result stays acyclic: neither node may reach the other
        except by a direct edge. b is dead afterwards; a keeps both nodes' edges."""
        if a == b or not (self.alive[a] and self.alive[b]):
            raise ValueError(f"contract_nodes({a}, {b}): need two distinct live nodes")
        if b in self.out[a]:
            src, dst = a, b
        elif a in self.out[b]:
            src, dst = b, a
        else:
            src, dst = (a, b) if self.rank[a] < self.rank[b] else (b, a)
        direct = dst in self.out[src]
        self.remove_edge(src, dst)
        if self.is_reachable(src, dst):
            if direct:
                self.insert_edge(src, dst)
            return False
        preds, succs = self.inn[b], self.out[b]
        self.inn[b], self.out[b] = set(), set()
        self.alive[b] = False
        for p in sorted(preds):
            self.out[p].discard(b)
        for s in sorted(succs):
            self.inn[s].discard(b)
        for p in sorted(preds):
            ok = self.insert_edge(p, a)
            assert ok, "contraction created a cycle: GraphCycles invariant broken"
        for s in sorted(succs):
            ok = self.insert_edge(a, s)
            assert ok, "contraction created a cycle: GraphCycles invariant broken"
        return True

    # ---- Pearce-Kelly internals ---------------------------------------------------------
    def _search(self, start: int, bound: int, forward: bool, stop: int | None) -> list[int] | None:
        """Nodes reachable from `start` (forward or backward) within the rank window up to
        (forward) or down to (backward) `bound`; None as soon as `stop` is reached."""
        self._stamp += 1
        mark, stamp, rank = self._mark, self._stamp, self.rank
        edges = self.out if forward else self.inn
        found = [start]
        mark[start] = stamp
        stack = [start]
        while stack:
            node = stack.pop()
            for nxt in edges[node]:
                if nxt == stop:
                    return None
                if mark[nxt] == stamp:
                    continue
                if (rank[nxt] < bound) if forward else (rank[nxt] > bound):
                    mark[nxt] = stamp
                    found.append(nxt)
                    stack.append(nxt)
        return found

    def _reorder(self, delta_b: list[int], delta_f: list[int]) -> None:
        rank = self.rank
        delta_b.sort(key=rank.__getitem__)
        delta_f.sort(key=rank.__getitem__)
        slots = sorted(rank[n] for n in delta_b + delta_f)
        for node, r in zip(delta_b + delta_f, slots):
            rank[node] = r

    def check_invariant(self) -> None:
        """Raise AssertionError unless every edge goes from a lower to a higher rank."""
        live_ranks = [r for r, alive in zip(self.rank, self.alive) if alive]
        assert len(set(live_ranks)) == len(live_ranks), "ranks are not distinct"
        for x, succs in enumerate(self.out):
            for y in succs:
                assert self.alive[x] and self.alive[y], f"edge {x}->{y} touches a dead node"
                assert self.rank[x] < self.rank[y], f"edge {x}->{y} breaks the rank order"
                assert x in self.inn[y], f"edge {x}->{y} missing from inn"
