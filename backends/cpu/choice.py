"""The fastest GEMM for each shape: oneDNN beside MLAS and NumPy, measured once and cached.

A MatMul/FusedMatMul/Gemm call big enough for a library (below that, gemm.py generates
code, or NumPy's call overhead wins) has up to four implementations: MLAS through a
single-node onnxruntime session, NumPy/OpenBLAS, oneDNN's matmul primitive (onednn.py,
optional) and, for constant weights, our prefetching GEMM over packed weights
(packed.py). `measure` times each on the call's own shapes, layouts and
constant weights (alternating short blocks, medians), keeps the fastest, and remembers the
answer per signature in this process and, with --cache_dir, in
`DIR/gemm_choices.json` for the next process (keyed by the CPU and library versions).

Strided operands (views: kernel/views.py) are native to oneDNN; MLAS and a stacked NumPy
matmul copy them first, and the measurement includes that copy.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
from autoclust.backends.cpu import onednn

GEMM_OPS = ("MatMul", "FusedMatMul", "Gemm")
# the large-GEMM implementations measured against MLAS (here, then in the plan: inplan.py)
RIVALS = ("onednn", "packed")
# Each candidate's best block: the host's bursts (another process, a noisy neighbour) only
# ever add time, and with medians of 3 rounds the same signature was measured both ways in
# one session (GPT-2's [64,3072]x[3072,768]: "mlas 2.12 ms, onednn 2.81 ms" in one process,
# oneDNN 5-15% faster in a quiet one), so BERT ran some layers on each.
ROUNDS = 7          # alternating rounds per candidate (after one untimed call each)
REPEAT = 2          # calls per timed block
BUDGET_S = 0.4      # a measurement stops adding rounds past this
F32 = np.dtype("float32")
Layouts = tuple  # per operand (inputs, then outputs): element strides, or None

_DISK: dict[str, Any] = {"dir": None, "entries": None}
_LOCK = threading.Lock()


def use_cache_dir(path: str | None) -> None:
    """Remember decisions in `path` (--cache_dir) across processes; None: memory only."""
    with _LOCK:
        if path != _DISK["dir"]:
            _DISK.update(dir=path, entries=None)


def onednn_builder(op: str, attrs: dict[str, Any], in_types: list, out_types: list,
                   threads: int, constants: dict[int, np.ndarray],
                   layouts: Layouts, post: Sequence[tuple] = ()) -> Callable | None:
    """A builder of oneDNN's run function for this call, or None where it cannot apply
    (not float32, a 1-D operand, an empty dim, Gemm's beta != 1). `post`: epilogue steps
    after Gemm's C (onednn.Matmul's format); their binary operands follow the call's
    inputs."""
    if op not in GEMM_OPS or onednn.unavailable():
        return None
    types = [t for t in in_types if t is not None] + list(out_types)
    if any(t[0] != F32 for t in types) or any(len(t[1]) < 2 for t in types[:2]):
        return None
    if any(0 in t[1] for t in types) or float(attrs.get("beta", 1.0)) != 1.0:
        return None
    has_c = op == "Gemm" and len(in_types) > 2 and in_types[2] is not None
    if has_c and len(in_types[2][1]) > 2:
        return None
    lay = list(layouts) if layouts else [None] * (len(in_types) + len(out_types))
    a = onednn.Operand(in_types[0][1], lay[0])
    b = onednn.Operand(in_types[1][1], lay[1])
    y = onednn.Operand(out_types[0][1], lay[len(in_types)])
    if attrs.get("transA", 0):
        a = a.swapped()
    if attrs.get("transB", 0):
        b = b.swapped()
    epilogue = ([("add", tuple(in_types[2][1]))] if has_c else []) + list(post)
    n_in = len(in_types)
    weights = constants.get(1) if 1 in constants and lay[1] is None else None

    def build(pack: bool = True) -> Callable:
        """The run function; `pack=False`: without packing the weights (onednn.Matmul),
        `run.packed` says whether an earlier packing serves it anyway."""
        mm = onednn.Matmul(a, b, y, float(attrs.get("alpha", 1.0)), epilogue, weights,
                           threads, pack)
        skip_b = mm.skip_b
        # unpacked constant weights are fed from here: callers may pass None for them
        fed_b = None if skip_b or weights is None else \
            np.ascontiguousarray(weights, np.float32).reshape(in_types[1][1])

        def run(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
            args = [inputs[0]] if skip_b else [inputs[0], inputs[1] if fed_b is None else fed_b]
            args.append(outputs[0])
            if has_c:
                args.append(inputs[2])
            args.extend(inputs[n_in:])  # the post-ops' operands
            mm(args)
        run.packed = skip_b or weights is None  # type: ignore[attr-defined]
        return run

    return build


def known(key: tuple, builders: dict[str, Callable]) -> tuple[str, str] | None:
    """The implementation of a large GEMM when it needs no measurement: the one
    --cache_dir recorded, oneDNN alone, or MLAS when oneDNN does not apply (None: measure
    MLAS against oneDNN, which library.py does in the background). NumPy is left out
    (OpenBLAS's busy-waiting threads collapse under load, and it copies strided stacks)."""
    rivals = [r for r in RIVALS if r in builders]
    if not rivals:
        why = onednn.unavailable() or "does not apply to these types"
        return ("mlas" if "mlas" in builders else "numpy"), f"large, onednn: {why}"
    if "mlas" not in builders and len(rivals) == 1:
        return rivals[0], f"large, only {rivals[0]} among the large-GEMM implementations"
    hit = _disk_get(_disk_key(key))
    if hit is not None and hit[0] in builders:
        return hit[0], hit[1] + " (--cache_dir)"
    return None


def measure(key: tuple, builders: dict[str, Callable], in_types: list, out_types: list,
            layouts: Layouts, constants: dict[int, np.ndarray],
            quiet: Callable[[], Any] = contextlib.nullcontext) -> tuple[str, str]:
    """(fastest implementation, a note with the best blocks) for one call signature.
    `quiet()`: a context the candidates are timed in (background.quiet_cores: no compiled
    run beside them)."""
    disk_key = _disk_key(key)
    hit = _disk_get(disk_key)
    if hit is not None and hit[0] in builders:
        return hit[0], hit[1] + " (--cache_dir)"
    ins, outs = _probe_arrays(in_types, out_types, layouts, constants)
    runs, notes = _built(builders, ins, outs)
    with quiet():  # built (and packed) beside the runs; timed without them
        times = _timed(runs, ins, outs)
    fastest = {name: min(ts) for name, ts in times.items()}
    best = min(fastest, key=fastest.__getitem__)
    rounds = min(len(ts) for ts in times.values())
    note = "measured " + ", ".join(f"{n} {t * 1e3:.3f} ms" for n, t in sorted(fastest.items()))
    note += f" (best of {rounds})"
    if notes:
        note += "; " + "; ".join(notes)
    if onednn.unavailable() and "onednn" not in builders:
        note += f"; onednn: {onednn.unavailable()}"
    _disk_put(disk_key, best, note)
    return best, note


def remember(key: tuple, choice: str, note: str) -> None:
    """Record a decision made after `measure` (in the plan: inplan.py) for --cache_dir."""
    _disk_put(_disk_key(key), choice, note)


def _built(builders: dict[str, Callable], ins: list, outs: list
           ) -> tuple[dict[str, Callable], list[str]]:
    """Each implementation built and run once, untimed (first touch, lazy setup): ({name:
    run}, notes on those that refused)."""
    runs: dict[str, Callable] = {}
    notes: list[str] = []
    for name, build in builders.items():
        try:
            runs[name] = build()
            runs[name](ins, outs)  # untimed: first-touch, lazy setup
        except Exception as exc:  # noqa: BLE001 - a refusing implementation is left out
            notes.append(f"{name} refused: {str(exc)[:60]}")
            runs.pop(name, None)
    if not runs:
        raise RuntimeError("; ".join(notes))
    return runs, notes


def _timed(runs: dict[str, Callable], ins: list, outs: list) -> dict[str, list[float]]:
    """Seconds per call of each implementation's blocks, alternating, within BUDGET_S."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    start = time.perf_counter()
    for _ in range(ROUNDS):
        for name, run in runs.items():
            t0 = time.perf_counter()
            for _ in range(REPEAT):
                run(ins, outs)
            times[name].append((time.perf_counter() - t0) / REPEAT)
        if time.perf_counter() - start > BUDGET_S:
            break
    return times


def _probe_arrays(in_types: list, out_types: list, layouts: Layouts,
                  constants: dict[int, np.ndarray]) -> tuple[list, list]:
    """Random operands in the call's own layouts (the constants themselves)."""
    rng = np.random.default_rng(0)
    lay = list(layouts) if layouts else [None] * (len(in_types) + len(out_types))

    def make(t: tuple, strides: Sequence[int] | None, random: bool) -> np.ndarray:
        dtype, shape = np.dtype(t[0]), tuple(t[1])
        if strides is None:
            base = np.empty(shape, dtype)
            if random:
                base[...] = rng.standard_normal(shape) if dtype.kind == "f" else 1
            return base
        span = 1 + sum((d - 1) * s for d, s in zip(shape, strides))
        flat = rng.standard_normal(max(span, 1)).astype(dtype)
        return np.lib.stride_tricks.as_strided(flat, shape, [s * dtype.itemsize
                                                             for s in strides])

    ins = [None if t is None else constants[i] if i in constants else make(t, lay[i], True)
           for i, t in enumerate(in_types)]
    outs = [make(t, lay[len(in_types) + j], False) for j, t in enumerate(out_types)]
    return ins, outs


def _disk_key(key: tuple) -> str:
    import llvmlite.binding as llvm
    return f"{llvm.get_host_cpu_name()}|ort {ort.__version__}|numpy {np.__version__}|" \
           f"dnnl {onednn.version()}|{key!r}"


def _path() -> str | None:
    d = _DISK["dir"]
    return None if not d else os.path.join(d, "gemm_choices.json")


def _disk_get(key: str) -> tuple[str, str] | None:
    path = _path()
    if path is None:
        return None
    with _LOCK:
        if _DISK["entries"] is None:
            try:
                with open(path) as f:
                    _DISK["entries"] = dict(json.load(f))
            except (OSError, ValueError, TypeError):
                _DISK["entries"] = {}
        hit = _DISK["entries"].get(key)
    return None if not isinstance(hit, list) or len(hit) != 2 else (str(hit[0]), str(hit[1]))


def _disk_put(key: str, choice: str, note: str) -> None:
    path = _path()
    if path is None:
        return
    with _LOCK:
        entries = _DISK["entries"] if _DISK["entries"] is not None else {}
        entries[key] = [choice, note]
        _DISK["entries"] = entries
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(entries, f)
            os.replace(tmp, path)  # atomic: a concurrent reader sees old or new, whole
        except OSError:
            pass  # an unwritable cache dir only costs a measurement next time


def in_place(fn: Callable, views: Sequence, n_in: int) -> Callable:
    """fn called on strided NumPy views of the buffers it is given (views: kernel-IR View
    or None per operand, inputs then outputs); a buffer's view is made once per array."""
    last: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def view_of(k: int, x: np.ndarray | None) -> np.ndarray | None:
        v = views[k] if k < len(views) else None
        if v is None or x is None:
            return x
        hit = last.get(k)
        if hit is not None and hit[0] is x:
            return hit[1]
        flat = x.reshape(-1)[v.offset:]
        strided = np.lib.stride_tricks.as_strided(flat, v.shape,
                                                  [s * x.itemsize for s in v.strides])
        last[k] = (x, strided)
        return strided

    def run(inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
        fn([view_of(k, x) for k, x in enumerate(inputs)],
           [view_of(n_in + j, y) for j, y in enumerate(outputs)])

    run.impl = getattr(fn, "impl", "")  # type: ignore[attr-defined]
    run.inner = fn  # type: ignore[attr-defined]  # its impl may switch (current_impl)
    run.note = getattr(fn, "note", "")  # type: ignore[attr-defined]
    return run
