"""Compile latency of one model: cold process, new sequence length, warm --cache_dir process.

    python -m autoclust.tools.bench.latency MODEL.onnx FEEDS.npz [--threads 2] [--profile DIR]

Three fresh processes share one temporary --cache_dir: `cold` (session, first run, the
runs until measured placement has decided, three steady runs, then a first run at 3/4 of
the sequence length, as `bench --exports` orders them), then `warm` twice (the same, with
the cache filled by `cold`). Prints one line per process: session s, first run s, new
length s, the median steady run s (and the runs it took to settle), and the LLVM compiles
of the first run + the new length. `--profile DIR` writes a cProfile of each process to
DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def _measure(model: str, feeds_path: str, threads: int, cache_dir: str) -> dict:
    from autoclust.backends import cpu
    from autoclust.tools.bench import exports as bench_exports
    from autoclust.tools.bench import timing
    with np.load(feeds_path) as z:
        feeds = {k: z[k] for k in z.files}
    t0 = time.perf_counter()
    sess = timing.autoclust_session(model, threads, f"--cache_dir={cache_dir}")
    t1 = time.perf_counter()
    sess.run(None, feeds)
    t2 = time.perf_counter()
    first = cpu.COMPILE_COUNT
    # as bench_exports: the new length comes after the steady state (prepacking done,
    # measured placement decided: its trials make the runs before it 3-4x slower)
    settle_runs = timing.settle(sess, feeds)
    steady = []
    for _ in range(3):
        t = time.perf_counter()
        sess.run(None, feeds)
        steady.append(time.perf_counter() - t)
    alt = bench_exports.new_seq_feeds(feeds)
    t3 = time.perf_counter()
    if alt is not None:
        sess.run(None, alt)
    t4 = time.perf_counter()
    return {"session_s": t1 - t0, "first_run_s": t2 - t1, "new_seq_s": t4 - t3,
            "steady_s": sorted(steady)[1], "settle_runs": settle_runs, "compiles_first": first,
            "compiles_new_seq": cpu.COMPILE_COUNT - first}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("feeds")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--profile", default="", help="write cold.prof, warm1.prof... here")
    p.add_argument("--warm", type=int, default=2, help="warm processes to run")
    p.add_argument("--cache_dir", default="", help="(internal) run one measurement")
    p.add_argument("--prof_out", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cache_dir:
        if args.prof_out:
            import cProfile
            prof = cProfile.Profile()
            row = prof.runcall(_measure, args.model, args.feeds, args.threads, args.cache_dir)
            prof.dump_stats(args.prof_out)
        else:
            row = _measure(args.model, args.feeds, args.threads, args.cache_dir)
        print(json.dumps(row))
        return 0
    from autoclust.tools.bench.exports import compile_bytecode
    compile_bytecode()  # the processes import bytecode, as an installed package does
    with tempfile.TemporaryDirectory(prefix="autoclust-latency-") as cache_dir:
        for name in ["cold"] + [f"warm{i + 1}" for i in range(args.warm)]:
            cmd = [sys.executable, "-m", "autoclust.tools.bench.latency", args.model,
                   args.feeds, "--threads", str(args.threads), "--cache_dir", cache_dir]
            if args.profile:
                os.makedirs(args.profile, exist_ok=True)
                cmd += ["--prof_out", os.path.join(args.profile, f"{name}.prof")]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            print(f"{name:6s} session {row['session_s']:6.2f} s  first run "
                  f"{row['first_run_s']:6.2f} s  new seq {row['new_seq_s']:6.2f} s  steady "
                  f"{row['steady_s']:6.2f} s (after {row['settle_runs']} runs)  "
                  f"LLVM compiles {row['compiles_first']} + {row['compiles_new_seq']}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
