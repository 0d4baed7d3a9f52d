"""`autoclust minify MODEL|DUMP|BUNDLE`: shrink a failing model to a minimal repro bundle.

    autoclust minify bisect_out/cluster_0001.bad_prefix --flags="--inject_bug=accuracy:Add"
    autoclust minify model.onnx --input x=x.npy --flags="--fast_math" --out repro/

The failure is what autoclust (with --flags, and every node free to cluster: min cluster
size 1) does wrong on the inputs, compared with onnxruntime: a mismatch beyond
--rtol/--atol, a compile error (a cluster fell back), an exception or a crash. Each trial
runs in a worker process, so a crash or a hang ends a trial, not minify. tools/debug/shrink.py
drops outputs and nodes, turns inputs into constants and makes shapes smaller while the
same failure persists: the same kind and exception type (and --match, a regular
expression, found in its message). Writes model.onnx, inputs.npz, expected.npz and
meta.json under --out and prints the `autoclust replay` command.
"""

from __future__ import annotations

import argparse
import re
import shlex
import time
from typing import Any

import onnx
from autoclust.tools.debug import repro, shrink
from autoclust.tools.debug.bisect import ALONE, Trials, describe, failed, verdict
from autoclust.tools.fuzz import check as fuzz_check
from autoclust.tools.fuzz import command as fuzz
from autoclust.tools.fuzz.check import Outcome


def signature(outcome: Outcome) -> tuple[str, ...]:
    """What makes two failures the same: kind, place and, for errors, the exception type."""
    kind, message = outcome.kind, outcome.message
    if kind == fuzz_check.FALLBACK:
        found = re.search(r"compile failed: (\w+)", message)
        return kind, outcome.where, found.group(1) if found else ""
    if kind == fuzz_check.ERROR:
        return kind, outcome.where, message.split(":", 1)[0]
    if kind == fuzz_check.CRASH:  # "worker killed by signal 4", "timed out after 60 s"
        return kind, outcome.where, re.sub(r"[\d.]+ s$", "", message)
    return kind, outcome.where


def minify(model: onnx.ModelProto, feeds: repro.Feeds, trials: Trials,
           match: str | None = None) -> tuple[onnx.ModelProto, repro.Feeds, Outcome] | None:
    """The smallest model found that fails like `model` does; None when it does not fail
    (or its failure does not match `match`)."""
    first = trials.run(model, feeds, **ALONE)
    pattern = re.compile(match) if match else None
    if not failed(first) and not first.failed:  # an interpreter mismatch is a failure too
        return None
    if pattern is not None and not pattern.search(first.message):
        trials.log(f"  the failure does not match --match: {describe(first)}")
        return None
    want = signature(first)
    trials.log(f"  original ({len(shrink.normalize(model).graph.node)} nodes, Constant nodes "
               f"not counted): {verdict(first)}")

    def still_fails(m: onnx.ModelProto, f: repro.Feeds) -> bool:
        outcome = trials.run(m, f, **ALONE)
        return signature(outcome) == want and (
            pattern is None or pattern.search(outcome.message) is not None)

    small, small_feeds = shrink.shrink(model, feeds, still_fails, log=trials.log)
    return small, small_feeds, first


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autoclust minify", description=__doc__.splitlines()[0])
    p.add_argument("model", help="a model, a dumped cluster DIR/cluster_NNNN or a bundle")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                   help="value for a symbolic dim when inputs are generated")
    p.add_argument("--flags", default="", help="AUTOCLUST_FLAGS of the failing runs")
    p.add_argument("--rtol", type=float, default=fuzz_check.RTOL,
                   help="relative tolerance for every float dtype (default: per dtype, "
                   "1e-4 float32, 8 ulps float16, 1e-9 float64)")
    p.add_argument("--atol", type=float, default=fuzz_check.ATOL,
                   help="absolute tolerance (default: the dtype's smallest normal number)")
    p.add_argument("--match", default=None, help="regex the failure message must contain")
    p.add_argument("--out", default="minify_out", help="bundle folder (default minify_out)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per trial")
    p.add_argument("--seed", type=int, default=0, help="seed of generated inputs")
    return p


def _print_repro(model: onnx.ModelProto, out: str, flags: str, meta: dict[str, Any]) -> None:
    from autoclust.importers.onnx import import_model
    print(f"minified {meta['original_nodes']} -> {meta['nodes']} nodes in {meta['trials']} "
          f"trials ({meta['seconds']:.1f} s): {meta['failure']}")
    print(import_model(model))
    flag_arg = f" --flags={shlex.quote(flags)}" if flags else ""
    print(f"repro bundle: {out} (model.onnx, inputs.npz, expected.npz, meta.json)")
    print(f"  autoclust replay {repro.shown(out)}{flag_arg}")


def main(argv: list[str]) -> int:
    """Entry point of `autoclust minify`: exit 1 when a repro was written, 0 if none fails."""
    from autoclust.tools.run import parse_assignments

    from autoclust import flags as flags_mod
    args = _parser().parse_args(argv)
    dims = {k: int(v) for k, v in parse_assignments(args.dim, "--dim").items()}
    model, feeds, source = repro.load_target(args.model, parse_assignments(args.input, "--input"),
                                             dims, args.seed)
    user_flags = flags_mod.parse_string(args.flags)
    print(f"autoclust minify {args.model}: {source}; flags {args.flags or '(none)'}", flush=True)
    start = time.perf_counter()
    worker = fuzz.Worker(args.timeout, args.rtol, args.atol)
    trials = Trials(user_flags, worker, desc="autoclust minify")
    try:
        found = minify(model, feeds, trials, args.match)
    finally:
        worker.close()
        trials.close()
    if found is None:
        print(f"no failure: autoclust matches onnxruntime ({trials.count} trial)")
        return 0
    small, small_feeds, first = found
    flags = repro.flags_text(trials.flags)
    meta = {"source": args.model, "failure": describe(first), "kind": first.kind,
            "message": first.message, "flags": repro.flags_text({**trials.flags, **ALONE}),
            "rtol": args.rtol, "atol": args.atol,
            "original_nodes": len(shrink.normalize(model).graph.node), "trials": trials.count,
            "seconds": round(time.perf_counter() - start, 2),
            "replay": f"autoclust replay {args.out} --flags={shlex.quote(flags)}"}
    repro.write_bundle(args.out, small, small_feeds, meta)
    meta["nodes"] = len(small.graph.node)
    _print_repro(small, args.out, flags, meta)
    return 1
