"""Parameters and buffers of inference graphs as constants of the clusters ("freezing").

Under torch.compile the module's parameters and buffers reach the backend as graph inputs
(Dynamo marks them static). In a graph that needs no gradients they are compiled as
constants, as ONNX initializers are: work on weights alone (the transpose in front of every
Linear's GEMM, rotary tables from a buffer) is done once, and GEMMs get prepacked weights.

    FrozenGraph(gm positions [0, 1, 3])     first call: build(args) with args 0, 1, 3 as
      guard holds? -> the built graph          constants; later calls check the guard
      guard fails  -> build again (a refresh)  (after MAX_REFRESHES: stop freezing, warn)

The values are only known at the first call (aot_autograd compiles on fake tensors), so the
graph is imported, clustered and rewritten then. The guard, per frozen tensor: the same
object, the same version counter (every in-place op under torch bumps it:
`load_state_dict`, `p.copy_()`, `p.mul_()` in no_grad) and the same data pointer
(`p.data = t` moves it without a bump). Writes that bypass the version counter (through
`p.data`, whose alias has a counter of its own, or through a NumPy view) are caught by
comparing SAMPLES elements of each tensor, bit for bit, with their values when frozen: a
write that changes a whole tensor is always seen; a sparse one that misses every sampled
element is not (`--freeze_params=false` for code that writes weights that way).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from autoclust.importers.torch.lowering import np_dtype
from torch import fx

MAX_REFRESHES = 4   # rebuilds for changed parameters before the graph stops freezing
SAMPLES = 8         # elements of each frozen tensor compared on every call
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def static_positions(gm: fx.GraphModule) -> list[int]:
    """Placeholder positions of the parameters and buffers aot_autograd marked static and
    the graph does not mutate; [] when its metadata does not line up with the graph."""
    from torch._guards import TracingContext
    ctx = TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    if meta is None or not meta.static_input_indices:
        return []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(meta.input_info) != len(placeholders):
        return []  # effect tokens or deduplicated inputs: positions would not match
    out = []
    for i in meta.static_input_indices:
        info = meta.input_info[i]
        val = placeholders[i].meta.get("val")
        if info.mutates_data or info.mutates_metadata or not _freezable(val):
            continue
        out.append(i)
    return out


def _freezable(val: Any) -> bool:
    return (isinstance(val, torch.Tensor) and val.device.type == "cpu" and
            np_dtype(val.dtype) is not None and
            all(isinstance(d, int) for d in val.shape))


def as_constant(t: torch.Tensor) -> np.ndarray:
    """A read-only NumPy view of a frozen tensor's memory (no copy)."""
    arr = t.detach().numpy()
    arr.flags.writeable = False
    return arr


class Guard:
    """Whether the tensors frozen at some positions are still the same, unchanged ones."""

    def __init__(self, positions: Sequence[int], args: Sequence[Any]):
        self.entries = [(i, args[i], args[i]._version, args[i].data_ptr()) for i in positions]
        self.samples: list[tuple[memoryview, int]] = []
        for i in positions:
            self.samples += _samples(args[i])
        self.expected = [mv[k] for mv, k in self.samples]

    def holds(self, args: Sequence[Any]) -> bool:
        for i, t, version, ptr in self.entries:
            a = args[i]
            if a is not t or a._version != version or a.data_ptr() != ptr:
                return False
        return [mv[k] for mv, k in self.samples] == self.expected


def _samples(t: torch.Tensor) -> list[tuple[memoryview, int]]:
    """(flat view of t's storage as unsigned ints, element offset) at SAMPLES positions
    spread over t, its first and last elements among them."""
    n = t.numel()
    if n == 0:
        return []
    storage = t.untyped_storage()
    elems = storage.nbytes() // t.element_size()
    flat = torch.empty(0, dtype=t.dtype).set_(storage, 0, (elems,), (1,))
    mv = memoryview(flat.numpy().view(_UINT[t.element_size()]))
    picks = np.unique(np.linspace(0, n - 1, min(n, SAMPLES)).astype(np.int64))
    coords = np.unravel_index(picks, tuple(t.shape)) if t.dim() else ()
    offsets = t.storage_offset() + sum(c * s for c, s in zip(coords, t.stride()))
    offsets = np.broadcast_to(np.asarray(offsets, np.int64), picks.shape)
    return [(mv, int(k)) for k in offsets]


class FrozenGraph:
    """The callable compile_aten returns when it freezes: builds at the first call, and
    again whenever the guard on the frozen tensors fails."""

    def __init__(self, positions: list[int], build: Callable[[dict[int, torch.Tensor]], Any],
                 report: Any):
        self.positions = positions
        self.build = build
        self.report = report
        self.guard: Guard | None = None
        self.module: Any = None
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        guard = self.guard
        if guard is None or not guard.holds(args):
            self._refresh(args)
        return self.module(*args)

    def _refresh(self, args: Sequence[Any]) -> None:
        with self._lock:
            if self.guard is not None and self.guard.holds(args):
                return  # another thread rebuilt it
            if self.guard is not None:
                self.report.refreshes += 1
                if self.report.refreshes > MAX_REFRESHES and self.positions:
                    warnings.warn(f"autoclust: graph {self.report.index}'s parameters changed "
                                  f"{self.report.refreshes} times: they are inputs from now "
                                  "on (not frozen)", RuntimeWarning, stacklevel=4)
                    self.positions = []
            self.module = self.build({i: args[i] for i in self.positions})
            self.guard = Guard(self.positions, args)
            self.report.frozen = len(self.positions)
