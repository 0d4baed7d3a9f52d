"""Dynamic batching: requests that differ only in their batch dim run as one.

    request a: x f32[2, 64]  \\                         / logits f32[2, 16] -> a
    request b: x f32[3, 64]  -> concat -> x f32[5, 64] -> run -> split
    request c: x f32[1, 32]  (another trailing shape: a group of its own)

Only along a batch dim the model declares: dim 0 of every input and every output, one
symbolic name. Rows must be independent of each other (as Triton assumes of a model with a
max_batch_size); `autoclust serve --max_batch_size` is opt-in for that reason. A batch whose
run fails runs its requests one by one, so each gets its own answer or its own error.
A merged batch is padded to a power of two rows (repeating its last row), so the fleet
compiles a handful of batch sizes rather than one per sum of request sizes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from autoclust.serve.protocol import InferRequest, TensorSpec

Run = Callable[[dict[str, np.ndarray], list[str]], dict[str, np.ndarray]]


def batch_dim(inputs: list[TensorSpec], outputs: list[TensorSpec]) -> str:
    """The symbolic name of dim 0 of every input and output; ValueError naming the first
    tensor that has none or another."""
    first = inputs[0].dim_names[0] if inputs and inputs[0].dim_names else None
    for kind, specs in (("input", inputs), ("output", outputs)):
        for s in specs:
            name = s.dim_names[0] if s.dim_names else None
            if name is None or name != first:
                dim0 = s.shape[0] if s.shape else "none (a scalar)"
                raise ValueError(
                    f"--max_batch_size needs a batch dim: dim 0 of every input and output, "
                    f"one symbolic name; {kind} {s.name!r} has dim 0 "
                    f"{name if name is not None else dim0}"
                    + (f" where input {inputs[0].name!r} has {first!r}" if first else ""))
    return first


def run_batch(run: Run, requests: list[InferRequest]) -> list[dict[str, np.ndarray] | Exception]:
    """Each request's outputs (or the exception its own run raised), running requests
    with the same input names, dtypes and trailing dims as one concatenated batch."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(requests):
        key = tuple(sorted((n, a.dtype.str, a.shape[1:]) for n, a in r.inputs.items()))
        groups.setdefault(key, []).append(i)
    answers: list = [None] * len(requests)
    for members in groups.values():
        batch = [requests[i] for i in members]
        results = _run_group(run, batch) if len(batch) > 1 else None
        if results is None:
            results = [_run_one(run, r) for r in batch]
        for i, res in zip(members, results):
            answers[i] = res
    return answers


def _run_one(run: Run, request: InferRequest) -> dict[str, np.ndarray] | Exception:
    try:
        return run(request.inputs, list(request.outputs))
    except Exception as exc:  # noqa: BLE001 - the request's own error, answered to it
        return exc


def _run_group(run: Run, batch: list[InferRequest]) -> list[dict[str, np.ndarray]] | None:
    """The outputs of a group run as one batch, split back; None when it failed or an
    output's dim 0 is not the batch (then each request runs alone)."""
    rows = [len(next(iter(r.inputs.values()))) for r in batch]
    total = sum(rows)
    padded = padded_rows(total)
    names = list(dict.fromkeys(n for r in batch for n in r.outputs))
    feeds = {n: _pad(np.concatenate([r.inputs[n] for r in batch]), padded)
             for n in batch[0].inputs}
    try:
        merged = run(feeds, names)
    except Exception:  # noqa: BLE001 - rerun alone: each request gets its own error
        return None
    if any(np.ndim(v) == 0 or len(v) != padded for v in merged.values()):
        return None
    cuts = np.cumsum(rows)  # the last part is the padding, dropped
    parts = {n: np.split(v, cuts)[:-1] for n, v in merged.items()}
    return [{n: parts[n][j] for n in r.outputs} for j, r in enumerate(batch)]


def padded_rows(rows: int) -> int:
    """The batch size a merged batch runs at: the next power of two, so that a fleet
    compiles a few batch sizes (1, 2, 4, 8, ...), not every sum of request sizes."""
    return 1 << max(rows - 1, 0).bit_length()


def _pad(arr: np.ndarray, rows: int) -> np.ndarray:
    # repeat the last real row: padding rows hold real values, so they raise no NaN or
    # division warnings that zeros might, and are dropped from the answers
    if len(arr) in (0, rows):
        return arr
    return np.concatenate([arr, np.repeat(arr[-1:], rows - len(arr), axis=0)])
