"""Two flag settings of autoclust against each other, in one process, order cancelled out.

    python -m autoclust.tools.bench.ab MODEL.onnx --feeds INPUTS.npz \\
        --a="--cpu_helpers=python" --b="" --rounds 10 --threads 2

Is a change worth it model-wide? Comparing ratios to onnxruntime from different processes
drowns a 5% effect in the machine's drift (one export read 0.87x-1.09x over four
processes), and two sessions of the same model in one process are not alike either: the
one made second ran ~10% slower on ConvNeXt whichever flags it had. So four sessions are
made in the order A, B, B, A, each settled (background prepacking done, placement
decided), and timed in alternating blocks with the order reversed every other round. A
side's figure is the median of its two sessions' blocks (each block's best run).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from typing import Any

import numpy as np
from autoclust.tools.bench import timing


def ab(model: str, feeds: dict[str, np.ndarray], a: str, b: str, rounds: int, block: int,
       threads: int) -> dict[str, Any]:
    """Medians (ms) of flag settings a and b and their ratio a / b (> 1: b is faster)."""
    sessions = []
    for side, flags in (("a", a), ("b", b), ("b", b), ("a", a)):
        sess = timing.autoclust_session(model, threads, flags)
        timing.settle(sess, feeds)
        sessions.append((side, sess))
    times: dict[str, list[float]] = {"a": [], "b": []}
    for r in range(rounds):
        order = range(4) if r % 2 == 0 else range(3, -1, -1)
        blocks = timing.alternate({i: functools.partial(sessions[i][1].run, None, feeds)
                                   for i in order}, 1, block)
        for i, ts in blocks.items():
            times[sessions[i][0]].append(min(ts))
    ma, mb = timing.median_ms(times["a"]), timing.median_ms(times["b"])
    return {"model": model, "a": a, "b": b, "a_ms": ma, "b_ms": mb, "a_over_b": ma / mb,
            "rounds": rounds, "block": block, "threads": threads}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autoclust.tools.bench.ab",
                                description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--feeds", required=True, help=".npz of the model's inputs by name")
    p.add_argument("--a", default="", help="AUTOCLUST_FLAGS-style flags of side a (--a=\"...\")")
    p.add_argument("--b", default="", help="AUTOCLUST_FLAGS-style flags of side b")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--block", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    feeds = dict(np.load(args.feeds))
    r = ab(args.model, feeds, args.a, args.b, args.rounds, args.block, args.threads)
    if args.json:
        print(json.dumps(r))
    else:
        print(f"a [{args.a}] {r['a_ms']:.2f} ms, b [{args.b}] {r['b_ms']:.2f} ms: "
              f"a / b {r['a_over_b']:.3f} ({args.rounds} rounds of {args.block}, "
              f"{args.threads} threads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
