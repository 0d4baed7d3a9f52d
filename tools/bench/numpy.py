"""autoclust.jit against plain NumPy on a memory-bound 10-op elementwise chain.

    python -m autoclust.tools.bench.numpy                      # 16M float32, 21 rounds, 2 threads
    python -m autoclust.tools.bench.numpy --n 4194304 --repeat 11 --threads 1 --json out.json

NumPy runs each op as its own pass over memory (10 passes, 9 temporaries); the jitted
function is one fused kernel (one read of x, one write of y). Runs alternate (NumPy,
NumPy with out= buffers, jit) round by round after one untimed warm-up each; the figures
are medians. The ratio is NumPy's time over jit's (above 1: jit is faster). A NumPy copy
of the same array is reported as the memory-bandwidth floor.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def chain10(x: np.ndarray) -> np.ndarray:
    """Ten elementwise ops, each one memory pass in NumPy."""
    y = x * 1.5
    y = y + 0.5
    y = y * y
    y = y - 0.25
    y = np.maximum(y, 0.0)
    y = y * 0.5
    y = y + x
    y = np.minimum(y, 4.0)
    y = y / 3.0
    return np.abs(y)


def chain10_out(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The same chain with NumPy's out= (no temporaries): the best plain NumPy does."""
    np.multiply(x, 1.5, out=y)
    np.add(y, 0.5, out=y)
    np.multiply(y, y, out=y)
    np.subtract(y, 0.25, out=y)
    np.maximum(y, 0.0, out=y)
    np.multiply(y, 0.5, out=y)
    np.add(y, x, out=y)
    np.minimum(y, 4.0, out=y)
    np.divide(y, 3.0, out=y)
    return np.abs(y, out=y)


def _time(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(n: int = 1 << 24, repeat: int = 21, threads: int = 2) -> dict[str, Any]:
    """Median milliseconds of NumPy, NumPy with out=, autoclust.jit and a copy; ratios."""
    import autoclust
    x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    buf = np.empty_like(x)
    fast = autoclust.jit(chain10, threads=threads)
    start = time.perf_counter()
    got = fast(x)  # trace + compile
    first_ms = (time.perf_counter() - start) * 1e3
    err = float(np.max(np.abs(got - chain10(x)))) if n else 0.0
    runs: dict[str, Callable[[], Any]] = {
        "numpy": lambda: chain10(x), "numpy_out": lambda: chain10_out(x, buf),
        "jit": lambda: fast(x), "copy": lambda: np.copyto(buf, x)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for fn in runs.values():
        fn()
    for _ in range(repeat):
        for k, fn in runs.items():
            times[k].append(_time(fn))
    ms = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    return {"n": n, "threads": threads, "repeat": repeat, "numpy_ms": ms["numpy"],
            "numpy_out_ms": ms["numpy_out"], "jit_ms": ms["jit"], "copy_ms": ms["copy"],
            "speedup": ms["numpy"] / ms["jit"], "speedup_vs_out": ms["numpy_out"] / ms["jit"],
            "first_call_ms": first_ms, "max_abs_err": err}


def report(r: dict[str, Any]) -> str:
    """The result as a small Markdown table."""
    return "\n".join([
        (f"10-op elementwise chain, {r['n']:,} float32, jit threads={r['threads']}, "
        f"medians of {r['repeat']} alternating rounds"),
        "",
        "| | ms | NumPy / this |",
        "|---|---:|---:|",
        f"| NumPy | {r['numpy_ms']:.2f} | 1.00x |",
        (f"| NumPy with out= buffers | {r['numpy_out_ms']:.2f} | "
        f"{r['numpy_ms'] / r['numpy_out_ms']:.2f}x |"),
        f"| autoclust.jit | {r['jit_ms']:.2f} | **{r['speedup']:.2f}x** |",
        (f"| NumPy copy (bandwidth floor) | {r['copy_ms']:.2f} | "
        f"{r['numpy_ms'] / r['copy_ms']:.2f}x |"),
        "",
        (f"first call (trace + compile + run): {r['first_call_ms']:.0f} ms; max abs error "
        f"vs NumPy: {r['max_abs_err']:.1e}")])


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1 << 24, help="elements (default 16M)")
    p.add_argument("--repeat", type=int, default=21, help="alternating rounds")
    p.add_argument("--threads", type=int, default=2, help="autoclust --threads")
    p.add_argument("--json", default="", help="also write the result to this file")
    args = p.parse_args(argv)
    result = measure(args.n, args.repeat, args.threads)
    print(report(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
