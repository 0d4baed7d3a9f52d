"""Shape classes: one compile of a cluster serves every input shape its guards accept.

A cluster's inputs have dims the model leaves open ("seq", "batch", or unnamed). On a run
with new shapes, the ClusterRunner first asks each compiled class whether it serves them;
only when none does it compiles a new one, with those dims symbolic:

    input_ids int64[1, seq], attention_mask int64[1, seq]      (the cluster's inputs)
    run with [1, 128], [1, 128]  ->  compile with seq = Sym("seq", hint 128)
        guards recorded: "seq - 512 <= 0" (position table), ...
    run with [1, 77], [1, 77]    ->  the class matches with seq = 77: bind, no compile
    run with [1, 600], [1, 600]  ->  a guard fails: compile another class (or fall back)

What stays concrete in a class: dims the model fixes, dims of size 0 or 1 in the run
being compiled (broadcasting and empty loops depend on them), dims past symbolic.UPPER,
every dim of an input whose values decide shapes (those values are part of the class too),
and anything a compile decision pinned (a guard "seq - 128 == 0"). Dims sharing a name
share a symbol, unless they differ in the compiled run. `match` checks a run's dtypes,
ranks, concrete dims, equal dims, the symbols' range and every guard before the compiled
code may see its inputs.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from autoclust import symbolic
from autoclust.ir import Graph

Pattern = tuple[tuple[Any, ...], ...]  # per input: int or symbol name per dim


@dataclasses.dataclass
class ShapeClass:
    """The input shapes one compiled executable serves."""

    dtypes: tuple[np.dtype, ...]
    dims: Pattern
    shape_values: tuple[tuple[int, bytes], ...]  # (input index, its bytes) deciding shapes
    guards: tuple[symbolic.Guard, ...]
    exe: Any  # the backend's parametric executable: bind(dims) -> Executable

    @property
    def symbols(self) -> list[str]:
        return sorted({d for dims in self.dims for d in dims if isinstance(d, str)})

    def match(self, inputs: list[Any]) -> dict[str, int] | str:
        """The symbols' values for these inputs, or the reason the class does not serve
        them."""
        if len(inputs) != len(self.dims):
            return f"{len(inputs)} inputs, the class has {len(self.dims)}"
        env: dict[str, int] = {}
        for i, (x, dtype, dims) in enumerate(zip(inputs, self.dtypes, self.dims)):
            if x.dtype != dtype or len(x.shape) != len(dims):
                return f"input {i} is {x.dtype}{list(x.shape)}"
            for d, (n, want) in enumerate(zip(x.shape, dims)):
                if want.__class__ is int:
                    if n != want:
                        return f"input {i} dim {d} is {n}, not {want}"
                elif env.setdefault(want, n) != n:
                    return f"{want} is {env[want]} and {n}"
        for name, n in env.items():
            if not symbolic.LOWER <= n <= symbolic.UPPER:
                return f"{name} = {n} is outside [{symbolic.LOWER}, {symbolic.UPPER}]"
        for i, data in self.shape_values:
            if inputs[i].tobytes() != data:
                return f"input {i} holds other shape values"
        for g in self.guards:
            if not g.holds(env):
                return f"{', '.join(f'{k} = {v}' for k, v in sorted(env.items()))} fails " \
                       f"the guard {g} (from {g.where})"
        return env

    def describe(self) -> str:
        """'seq (3 guards)' for --log and explain; 'no symbolic dims' when pinned."""
        free = self.free_symbols()
        if not free:
            return "no symbolic dims"
        return f"{', '.join(free)} symbolic ({len(self.guards)} guards)"

    def free_symbols(self) -> list[str]:
        """The symbols no guard pins to one value."""
        pinned = {g.pins() for g in self.guards} - {None}
        return [s for s in self.symbols if s not in pinned]


def symbolic_types(graph: Graph, inputs: list[Any], shape_value_index: list[int]
                   ) -> tuple[list[tuple[np.dtype, tuple]], Pattern] | None:
    """(input types with symbolic dims, the class pattern) for compiling these inputs'
    class; None when no dim can be symbolic."""
    names: dict[str, int] = {}  # symbol -> its value in this run
    taken: set[str] = set()
    types, pattern = [], []
    for i, (v, x) in enumerate(zip(graph.inputs, inputs)):
        declared = v.shape if v.shape is not None and len(v.shape) == x.ndim \
            else (None,) * x.ndim
        shape: list[Any] = []  # ints and Syms
        dims: list[int | str] = []  # the pattern: a fixed size or a symbol's name
        for d, (decl, n) in enumerate(zip(declared, x.shape)):
            n = int(n)
            if isinstance(decl, int) or i in shape_value_index or \
                    not symbolic.LOWER <= n <= symbolic.UPPER:
                shape.append(n)
                dims.append(n)
                continue
            name = _identifier(decl if isinstance(decl, str) else f"{v.name}_{d}", taken)
            if names.get(name, n) != n:  # same name, another value: a symbol of its own
                name = _identifier(f"{name}_{v.name}_{d}", taken)
            names[name] = n
            taken.add(name)
            shape.append(symbolic.dim(name, n))
            dims.append(name)
        types.append((x.dtype, tuple(shape)))
        pattern.append(tuple(dims))
    if not names:
        return None
    return types, tuple(pattern)


def _identifier(text: str, taken: set[str]) -> str:
    """A Python identifier for a symbol (it appears in code keys and messages)."""
    name = re.sub(r"\W", "_", text)
    return name if name and not name[0].isdigit() else f"d_{name}"
