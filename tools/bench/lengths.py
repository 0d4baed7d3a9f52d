"""A stream of sequence lengths, as a server sees: new-length cost, compiles, warm speed.

    python -m autoclust.tools.bench.lengths MODEL.onnx FEEDS.npz [--lengths 20] [--threads 2]

One process, default flags (measured placement on). The session first runs the feeds'
own length (the cold compile), then each of `--lengths` other lengths (seeded, between 8
and the feeds' length) once: its wall time, the LLVM compiles and lowerings it caused, its
largest difference from onnxruntime. Then every length again, warm, timed against
onnxruntime in alternating blocks (timing.alternate) once placement has decided it. Ends with the RuntimeWarnings seen
(a megamorphic fallback warns) and each cluster's compiles, shape classes and fallback.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import numpy as np


def _at(feeds: dict[str, np.ndarray], seq: int) -> dict[str, np.ndarray]:
    return {k: np.ascontiguousarray(v[:, :seq]) for k, v in feeds.items()}


def _first_runs(sess, ort_sess, feeds, lengths) -> list[tuple]:
    from autoclust.backends import cpu
    from autoclust.tools.bench import timing

    from autoclust import compile as compile_mod
    rows = []
    for seq in lengths:
        f = _at(feeds, seq)
        llvm, lowered = cpu.COMPILE_COUNT, compile_mod.COUNTS["lowered"]
        t0 = time.perf_counter()
        got = sess.run(None, f)
        ms = (time.perf_counter() - t0) * 1e3
        err = timing.max_abs_err(got, ort_sess.run(None, f))
        rows.append((seq, ms, cpu.COMPILE_COUNT - llvm, compile_mod.COUNTS["lowered"] - lowered,
                     err))
    return rows


def _warm(sess, ort_sess, feeds, lengths, rounds: int, block: int) -> list[tuple]:
    """(seq, autoclust ms, onnxruntime ms): medians of alternating blocks per length."""
    from autoclust.tools.bench import timing
    ratios = []
    for seq in lengths:
        f = _at(feeds, seq)
        timing.settle(sess, f)  # measured placement decided for this length
        t = timing.alternate({"ac": lambda f=f: sess.run(None, f),
                              "ort": lambda f=f: ort_sess.run(None, f)}, rounds, block)
        ratios.append((seq, timing.median_ms(t["ac"]), timing.median_ms(t["ort"])))
    return ratios


def main(argv: list[str] | None = None) -> int:
    from autoclust.backends.cpu import library
    from autoclust.tools.bench import timing
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("feeds")
    p.add_argument("--lengths", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--block", type=int, default=2)
    p.add_argument("--flags", default="", help="autoclust flags, e.g. symbolic_dims=False")
    a = p.parse_args(argv)
    with np.load(a.feeds) as z:
        feeds = {k: z[k] for k in z.files}
    full = feeds["input_ids"].shape[1]
    rng = np.random.default_rng(0)
    lengths = [int(s) for s in rng.choice(np.arange(8, full), a.lengths, replace=False)]
    ort_sess = timing.ort_session(a.model, a.threads)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        sess = timing.autoclust_session(a.model, a.threads, a.flags)
        rows = _first_runs(sess, ort_sess, feeds, [full])
        library.wait_background(timeout=60)
        rows += _first_runs(sess, ort_sess, feeds, lengths)
        print("seq  first run ms  llvm compiles  lowerings  max |diff| vs onnxruntime")
        for seq, ms, llvm, lowered, err in rows:
            print(f"{seq:4d}  {ms:12.1f}  {llvm:13d}  {lowered:9d}  {err:.2e}")
        ratios = _warm(sess, ort_sess, feeds, lengths, a.rounds, a.block)
    print("seq  autoclust ms  onnxruntime ms  onnxruntime/autoclust")
    for seq, ac, ort_ms in ratios:
        print(f"{seq:4d}  {ac:12.2f}  {ort_ms:14.2f}  {ort_ms / ac:.3f}x")
    speedups = [o / c for _, c, o in ratios]
    print(f"warm onnxruntime/autoclust over {len(ratios)} lengths: median "
          f"{np.median(speedups):.3f}x, min {min(speedups):.3f}x, max {max(speedups):.3f}x, "
          f"geomean {timing.geomean(speedups):.3f}x")
    new = [r[1] for r in rows[1:]]
    print(f"new-length first run: median {np.median(new):.0f} ms, max {max(new):.0f} ms; "
          f"LLVM compiles after the first length: {sum(r[2] for r in rows[1:])}")
    warned = [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]
    print(f"RuntimeWarnings: {len(warned)}" + "".join(f"\n  {w}" for w in warned))
    for r in sess._runtime.compiled_clusters():
        print(f"{r.name}: compiles {r.compiles}, shape classes {len(r.classes)}, bindings "
              f"{r.bindings}, fallback {r.fallback_reason or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
