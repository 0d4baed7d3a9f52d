"""`autoclust bench --torch`: torch.compile(backend="autoclust") vs eager and inductor.

    autoclust bench --torch                        # every model, writes bench_out/torch.{json,md}
    autoclust bench --torch --models bert,gpt2 --rounds 9 --no-inductor
    autoclust bench --torch --processes 3         # each model in 3 processes: range over them
    python -m autoclust.tools.bench.torch --list

What users run: real transformers modules (tools/bench/torch_models.py: random weights, no
download, batch 1, 4 layers where the model has layers), called with their inputs under
torch.no_grad(), torch.set_num_threads(--threads). Each model runs in its own process: eager
torch, torch.compile(backend="autoclust") and torch.compile(backend="inductor") on the same
module, each side's first call timed (Dynamo tracing and compiling included, after one
untimed Dynamo-only trace so neither side pays the process's one-time costs; inductor's
on-disk caches are as this machine left them), then the sides timed in alternating blocks over
rounds (tools/bench/timing.py), medians. The spread is the 25th-75th percentile over rounds
of each round's ratio. OMP_WAIT_POLICY=PASSIVE (unless set): torch's OpenMP threads
otherwise spin after a side's run and steal the cores from the next side's.
Models marked "not tuned for" are reported apart.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from autoclust.tools.bench import timing
from autoclust.tools.bench import torch_models as models

SIDES = ("eager", "autoclust", "inductor")


def _side(model: Any, side: str, options: dict[str, Any]) -> Any:
    import torch
    if side == "eager":
        return model
    return torch.compile(model, backend=side, options=options if side == "autoclust" else None)


def run_one(name: str, rounds: int, block: int, threads: int, sides: list[str],
            options: dict[str, Any], size: str = models.BENCH) -> dict[str, Any]:
    """Measure one model in this process; returns its result row."""
    import torch
    from autoclust.importers.torch import fx as torch_fx
    torch.set_num_threads(threads)
    module, args = models.build(name, size)
    spec = models.MODELS[name]
    row: dict[str, Any] = {"model": name, "title": spec.title, "tuned": spec.tuned,
                           "threads": threads, "size": size}
    fns: dict[str, Callable[[], Any]] = {}
    with torch.no_grad():
        want = module(*args)
        row["max_abs_out"] = float(want.abs().max())
        _warm_up_dynamo(module, args)
        for side in sides:
            fn = _side(module, side, options)
            got, ms = timing.timed_ms(lambda fn=fn: fn(*args))
            row[f"{side}_first_s"] = ms / 1e3
            row[f"{side}_err"] = float((got - want).abs().max())
            fns[side] = lambda fn=fn: fn(*args)
        _wait_for_prepacking()
        times = timing.alternate(fns, rounds, block)
    for side, samples in times.items():
        row[f"{side}_ms"] = timing.median_ms(samples)
    for other in (s for s in ("eager", "inductor") if s in sides and "autoclust" in sides):
        row[f"{other}_ratio"] = row[f"{other}_ms"] / row["autoclust_ms"]
        row[f"{other}_p25"], row[f"{other}_p75"] = timing.ratio_spread(
            times, other, "autoclust", block)
    if "autoclust" in sides:
        reports = torch_fx.reports()
        row["graphs"] = len(reports)
        row["clusters"] = sum(len(r.clusters) for r in reports)
        row["eager_nodes"] = sum(len(r.eager) for r in reports)
        row["kernels"] = sum(k for r in reports for c in r.clusters
                             for k in c.stats()["kernels"])
        row["eager_ops"] = sorted({t for r in reports for _, t, _ in r.eager})
    row["load"] = timing.load_note()
    return row


def _warm_up_dynamo(module: Any, args: tuple) -> None:
    """Trace the model once with Dynamo alone (backend "eager"), then forget it: the first
    compiled side would otherwise pay the process's one-time costs (imports, source
    caches: 0.5-1.5 s here) and the next side's first call would look faster."""
    import torch
    torch.compile(module, backend="eager")(*args)
    torch._dynamo.reset()


def _wait_for_prepacking() -> None:
    """Time the steady state: autoclust builds MLAS's prepacked-weight sessions in the
    background after the first run (backends/cpu/library.py)."""
    from autoclust.backends.cpu import library
    library.wait_background(timeout=120)


# ---- the tables ------------------------------------------------------------------------------

def _ratio(r: dict[str, Any], other: str) -> str:
    if f"{other}_ratio" not in r:
        return ""
    text = f"**{r[f'{other}_ratio']:.2f}x** ({r[f'{other}_p25']:.2f}-{r[f'{other}_p75']:.2f})"
    if r.get("processes", 1) > 1:
        text += (f" [{r[f'{other}_lo']:.2f}-{r[f'{other}_hi']:.2f} over "
                 f"{r['processes']} processes]")
    return text


def merge(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per model: a model measured in several processes (--processes, or several
    --tables files) gets the median of each figure and its ratios' range over processes."""
    by_model: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(r)
    merged = []
    for runs in by_model.values():
        ok = [r for r in runs if "error" not in r]
        if len(ok) < 2:
            merged.append(ok[0] if ok else runs[0])
            continue
        row = dict(ok[0], processes=len(ok))
        for key, value in ok[0].items():
            if isinstance(value, float) and all(isinstance(r.get(key), float) for r in ok):
                row[key] = float(statistics.median(r[key] for r in ok))
        for other in ("eager", "inductor"):
            ratios = [r[f"{other}_ratio"] for r in ok if f"{other}_ratio" in r]
            if len(ratios) == len(ok):
                row[f"{other}_lo"], row[f"{other}_hi"] = min(ratios), max(ratios)
        merged.append(row)
    return merged


def _cells(r: dict[str, Any]) -> list[str]:
    if "error" in r:
        return [r["model"], "error: " + r["error"]] + [""] * 7
    first = " / ".join(f"{r[f'{s}_first_s']:.1f}" for s in ("autoclust", "inductor")
                       if f"{s}_first_s" in r)
    errs = " / ".join(f"{r[f'{s}_err']:.1e}" for s in ("autoclust", "inductor")
                      if f"{s}_err" in r)
    counts = (f"{r['graphs']} / {r['clusters']} / {r['eager_nodes']} / {r['kernels']}"
              if "clusters" in r else "")
    return [r["title"], timing.fmt_ms(r.get("eager_ms")), timing.fmt_ms(r.get("autoclust_ms")),
            timing.fmt_ms(r.get("inductor_ms")), _ratio(r, "eager"), _ratio(r, "inductor"),
            first, counts, errs]


def _geomean_row(rows: list[dict[str, Any]], label: str) -> list[str]:
    cells = [label, "", "", ""]
    for other in ("eager", "inductor"):
        ratios = [r[f"{other}_ratio"] for r in rows if f"{other}_ratio" in r]
        cells.append(f"**{timing.geomean(ratios):.2f}x**" if ratios else "")
    return cells + ["", "", ""]


def markdown(rows: list[dict[str, Any]]) -> str:
    """The speed table: tuned models, their geomean, then the ones not tuned for."""
    tuned = [r for r in rows if r.get("tuned", True)]
    kept = [r for r in rows if not r.get("tuned", True)]
    body = [_cells(r) for r in tuned]
    if len(tuned) > 1:
        body.append(_geomean_row(tuned, "geomean"))
    if kept:
        body.append(["*not tuned for:*"] + [""] * 8)
        body += [_cells(r) for r in kept]
        if len(kept) > 1:
            body.append(_geomean_row(kept, "geomean, not tuned for"))
        if tuned:
            body.append(_geomean_row(tuned + kept, f"geomean of all {len(rows)}"))
    return timing.table(["model", "eager ms", "autoclust ms", "inductor ms",
                         "eager / autoclust (p25-p75)", "inductor / autoclust (p25-p75)",
                         "first call s (autoclust / inductor)",
                         "graphs / clusters / eager nodes / kernels",
                         "max abs err vs eager (autoclust / inductor)"], body)


# ---- the driver ------------------------------------------------------------------------------

def _child(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """run_one in a process of its own; its last stdout line is the row."""
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if args.cold_inductor:  # a cache of its own, empty: inductor's first call as on a new box
        env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="autoclust-bench-inductor-")
    cmd = [sys.executable, "-m", "autoclust.tools.bench.torch", "--one", name, "--rounds",
           str(args.rounds), "--block", str(args.block), "--threads", str(args.threads),
           "--sides", args.sides, f"--flags={args.flags}", "--size", args.size]  # "=": a
    # value that starts with "--" is not an option
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
    finally:
        if args.cold_inductor:
            shutil.rmtree(env["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"model": name, "tuned": models.MODELS[name].tuned,
                "error": _failure(proc.stderr)}
    return json.loads(lines[-1])


def _failure(stderr: str) -> str:
    """A failed child's last line, with the traceback's innermost frame where there is one:
    a ViT child once died of "UnicodeDecodeError: 'ascii' codec can't decode byte 0xe2"
    (1 process of 16, not reproduced in 7 more), and the line alone did not say where."""
    err = stderr.strip().splitlines() or ["failed"]
    frames = [ln.strip() for ln in err if ln.lstrip().startswith('File "')]
    return (err[-1] + (f" (at {frames[-1]})" if frames else ""))[:500]


def _options(flags: str) -> dict[str, Any]:
    from autoclust import flags as flags_mod
    return flags_mod.parse_string(flags)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autoclust bench --torch",
                                description=__doc__.splitlines()[0])
    p.add_argument("--models", default="", help=f"comma-separated of {', '.join(models.MODELS)}")
    p.add_argument("--list", action="store_true", help="list the models and exit")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--processes", type=int, default=1, help="measure each model in this "
                   "many processes; the table shows medians and the ratios' range over them")
    p.add_argument("--rounds", type=int, default=7, help="alternating rounds")
    p.add_argument("--block", type=int, default=3, help="timed calls per side per round")
    p.add_argument("--sides", default=",".join(SIDES), help="comma-separated of eager, "
                   "autoclust, inductor")
    p.add_argument("--no-inductor", action="store_true", help="leave inductor out")
    p.add_argument("--cold-inductor", action="store_true",
                   help="give inductor an empty cache directory per model (its first call "
                   "as on a new machine); by default its on-disk caches are as found")
    p.add_argument("--flags", default="", help="AUTOCLUST_FLAGS-style flags for autoclust")
    p.add_argument("--size", default=models.BENCH, choices=[models.BENCH, models.TINY])
    p.add_argument("--out", default="bench_out")
    p.add_argument("--tables", nargs="+", metavar="JSON", help="print one table from the "
                   "torch.json files of earlier runs (e.g. tuned and not-tuned-for models "
                   "measured in two calls) and exit")
    p.add_argument("--one", default="", help=argparse.SUPPRESS)  # child: one model
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of `autoclust bench --torch`."""
    args = _parser().parse_args(argv)
    if args.tables:
        rows = []
        for path in args.tables:
            with open(path) as f:
                rows += json.load(f)["rows"]
        print(markdown(merge(rows)), end="")
        return 0
    if args.list:
        for name, spec in models.MODELS.items():
            print(f"{name:9s} {spec.title}" + ("" if spec.tuned else "  (not tuned for)"))
        return 0
    sides = [s for s in args.sides.split(",") if s and not (args.no_inductor and
                                                           s == "inductor")]
    args.sides = ",".join(sides)
    names = [m for m in args.models.split(",") if m] or list(models.MODELS)
    unknown = [m for m in names if m not in models.MODELS] + [s for s in sides
                                                             if s not in SIDES]
    if unknown:
        print(f"autoclust bench --torch: unknown {unknown}; models: "
              f"{', '.join(models.MODELS)}; sides: {', '.join(SIDES)}", file=sys.stderr)
        return 2
    if args.one:
        print(json.dumps(run_one(args.one, args.rounds, args.block, args.threads, sides,
                                 _options(args.flags), args.size)))
        return 0
    rows = []
    for name in names:
        for _ in range(args.processes):
            rows.append(_child(name, args))
            print(" | ".join(_cells(rows[-1])), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "torch.json"), "w") as f:
        json.dump({"threads": args.threads, "rounds": args.rounds, "block": args.block,
                   "flags": args.flags, "cold_inductor": args.cold_inductor, "rows": rows},
                  f, indent=2)
    text = markdown(merge(rows))
    with open(os.path.join(args.out, "torch.md"), "w") as f:
        f.write(text)
    print(text + f"wrote {args.out}/torch.json, torch.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
