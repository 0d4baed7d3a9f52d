"""Copy-aware placement for backends that keep values in device memory (the GPU).

On such a backend every cluster runs on the device and every onnxruntime segment on the
host, so each value crossing between the two is copied once per run (autoclust/runtime/transfers.py
counts and predicts them). A small cluster sandwiched between onnxruntime segments then
costs more in copies than it saves: running its few elementwise ops on the host, where its
inputs already are, avoids two trips over PCIe. After profitability, `copy_bound` hands
such clusters back to onnxruntime:

    x -> Conv (host) -> Mul -> Add -> Conv (host)
         the Mul+Add cluster would copy 2 values (its input down, its output back up);
         onnxruntime's kernels read or write 6 tensors on the host: 6 < 4 * 2, so it
         stays on the host with the Convs.

The estimate counts tensors, not bytes (shapes may be symbolic; the values of one
elementwise cluster mostly share a shape): `crossing` is the number of values the cluster
reads from or writes to host-side nodes (graph inputs and outputs are not counted: the
user puts them where they want, NumPy or device arrays), `traffic` the tensors the
cluster's onnxruntime kernels would read and write on the host. A cluster stays on the
device when traffic >= HOST_TRAFFIC_PER_COPY * crossing, or when it makes a library call
(a device GEMM beats the host's by far more than its copies cost), or when onnxruntime
could not run it (`keep`). Dropping a cluster moves its values to the host, which can make
a neighbour copy-bound in turn, so the rule runs to a fixed point.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autoclust import ops

# One PCIe copy (pageable host memory ~25 GB/s, plus a launch and a synchronisation of
# ~10 us) against one tensor read or write by an onnxruntime CPU kernel (~10 GB/s
# effective on a few cores, plus per-op dispatch). An estimate, not yet measured on a GPU
# machine: `autoclust bench --device gpu` on a model with mixed steps calibrates it.
HOST_TRAFFIC_PER_COPY = 4


def copy_bound(an: Any, kept: list[list[int]], keep: Callable[[list[int]], bool]
               ) -> tuple[list[list[int]], dict[int, str]]:
    """(clusters that stay on the device, reason per node of those handed back).

    `an` is clustering's per-node analysis (nodes, weight, opdefs, static, position);
    `keep(members)` says a cluster must stay compiled whatever it costs.
    """
    reasons: dict[int, str] = {}
    kept = list(kept)
    while True:
        on_device = {i for members in kept for i in members}
        for members in kept:
            if keep(members) or any(an.opdefs[i].kind == ops.LIBRARY for i in members):
                continue
            crossing, traffic = _costs(an, members, on_device)
            if crossing and traffic < HOST_TRAFFIC_PER_COPY * crossing:
                why = (f"kept in onnxruntime: on the device this cluster would copy "
                       f"{crossing} values between host and device per run, while "
                       f"onnxruntime reads and writes {traffic} tensors on the host "
                       f"(placement.copy_bound)")
                reasons.update((i, why) for i in members)
                kept.remove(members)
                break
        else:
            return kept, reasons


def _costs(an: Any, members: list[int], on_device: set[int]) -> tuple[int, int]:
    """(values crossing between the cluster and host-side nodes, tensors its nodes would
    read and write in onnxruntime)."""
    inside = set(members)
    graph = an.graph
    crossing: set[str] = set()
    traffic = 0
    for i in members:
        node = an.nodes[i]
        written = an.weight[i] > 0 and not an.opdefs[i].view
        for v in node.all_inputs():
            if v.name in graph.initializers or v.name in an.static:
                continue
            traffic += written
            p = v.producer
            if p is None or p.op == "Constant":  # graph input, or uploaded once
                continue
            j = an.position.get(id(p))
            if j is not None and j not in inside and j not in on_device:
                crossing.add(v.name)
        for v in node.outputs:
            if v is None:
                continue
            traffic += written
            users = [an.position.get(id(u)) for u, _ in v.uses]
            if any(u is not None and u not in on_device for u in users):
                crossing.add(v.name)
    return len(crossing), traffic
