"""Speed tests' timing: onnxruntime as the brief measures it (2 intra-op threads, spinning
off) against autoclust, in short blocks alternating over rounds in one process."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort


def ort_session(model: onnx.ModelProto, threads: int = 2) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def median_us(fn: Callable[[], object], rounds: int = 5, block: int = 10) -> float:
    """Median over `rounds` of the mean time of `block` calls (one untimed call first)."""
    fn()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(block):
            fn()
        times.append((time.perf_counter() - t) / block * 1e6)
    return float(np.median(times))


def ratio(theirs: Callable[[], object], ours: Callable[[], object],
          alternations: int = 3) -> tuple[float, list[float], list[float]]:
    """(median of theirs / median of ours, their times, our times), in microseconds."""
    a, b = [], []
    for _ in range(alternations):
        a.append(median_us(theirs))
        b.append(median_us(ours))
    return float(np.median(a) / np.median(b)), a, b
