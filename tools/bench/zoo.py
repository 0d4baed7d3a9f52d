"""`autoclust bench --zoo` and `--micro`: the committed zoo and issue 11's micro table.

    autoclust bench --zoo                      # every models/*.onnx at its committed feed dims
    autoclust bench --micro                    # GELU, softmax, LayerNorm, RMSNorm, 16-op chain
    autoclust bench --zoo --models mlp_gelu,gelu --rounds 9

Each model or case runs in its own process: onnxruntime (ORT_ENABLE_ALL, `--threads`,
spinning off) and autoclust (same SessionOptions and threads), and for the micro GELU case a
NumPy copy of the same bytes (the memory floor), timed in alternating blocks over rounds
(tools/bench/timing.py), medians; ratio = onnxruntime / autoclust. The zoo table starts with the
README's main job (mlp_gelu); the micro table prints issue 11's target beside each figure.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from autoclust.tools.bench import timing

MODELS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "models")
MAIN_JOB = "mlp_gelu"

# case (tools/bench/command.py CASES) -> (title, target kind, target value). "ratio": onnxruntime /
# autoclust must reach the value; "copy": autoclust time / NumPy copy time must stay below.
MICRO: dict[str, tuple[str, str, float]] = {
    "gelu": ("erf-GELU, 16M floats", "copy", 1.2),
    "softmax_mask": ("scale+mask+softmax [16,12,128,128]", "ratio", 2.0),
    "layernorm": ("decomposed LayerNorm [32,128,768]", "ratio", 1.5),
    "rmsnorm_gate": ("RMSNorm+SiLU gate [4096,1024]", "ratio", 2.0),
    "chain16": ("16-op chain, 16M floats", "ratio", 10.0),
}
ZOO_TARGET = 1.0


def zoo_models() -> list[str]:
    """Paths of the committed zoo files, the README's main job first."""
    paths = sorted(glob.glob(os.path.join(MODELS_DIR, "*.onnx")))
    main = [p for p in paths if os.path.basename(p) == f"{MAIN_JOB}.onnx"]
    return main + [p for p in paths if p not in main]


def measure(model: Any, feeds: dict[str, np.ndarray], threads: int, rounds: int, block: int,
            flags: str = "", extra: dict[str, Callable[[], Any]] | None = None
            ) -> dict[str, Any]:
    """One model: onnxruntime vs autoclust (plus `extra` sides), alternating; a result row."""
    ref = timing.ort_session(model, threads)
    want = ref.run(None, feeds)
    sess = timing.autoclust_session(model, threads, flags)
    got, first_ms = timing.timed_ms(lambda: sess.run(None, feeds))
    stats = sess.stats()["clusters"]
    row: dict[str, Any] = {
        "first_run_ms": first_ms, "max_abs_err": timing.max_abs_err(got, want),
        "clusters": len(stats), "kernels": sum(k for c in stats for k in c["kernels"]),
        "segments": len(sess.plan.steps) - len(sess.plan.clusters) if sess.plan else 0,
        "fallbacks": [c["fallback"] for c in stats if c["fallback"]],
        "feeds": ", ".join(f"{k}{list(v.shape)}" for k, v in feeds.items())}
    sides = {"ort": lambda: ref.run(None, feeds), "autoclust": lambda: sess.run(None, feeds)}
    sides.update(extra or {})
    times = timing.alternate(sides, rounds, block)
    for side, samples in times.items():
        row[f"{side}_ms"] = timing.median_ms(samples)
    row["ratio"] = row["ort_ms"] / row["autoclust_ms"]
    row["ratio_p25"], row["ratio_p75"] = timing.ratio_spread(times, "ort", "autoclust", block)
    row["load"] = timing.load_note()
    return row


def zoo_row(path: str, threads: int = 2, rounds: int = 7, block: int = 5,
            flags: str = "") -> dict[str, Any]:
    """A committed zoo file at its committed feed dims."""
    import onnx
    from autoclust.models import zoo
    model = onnx.load(path)
    row = measure(path, zoo.feeds(model), threads, rounds, block, flags)
    return dict(row, model=os.path.basename(path)[:-len(".onnx")])


def micro_row(case: str, threads: int = 2, rounds: int = 7, block: int = 3,
              flags: str = "") -> dict[str, Any]:
    """One micro case of tools/bench/command.py at its size; GELU also times a NumPy copy."""
    from autoclust.tools.bench import command as bench
    model, feeds = bench._build(case)
    extra = {}
    if MICRO[case][1] == "copy":
        src = next(iter(feeds.values()))
        dst = np.empty_like(src)
        extra["copy"] = lambda: np.copyto(dst, src)
    row = measure(model, feeds, threads, rounds, block, flags, extra)
    return dict(row, case=case, title=MICRO[case][0])


def _verdict(value: float, kind: str, target: float) -> str:
    ok = value <= target if kind == "copy" else value >= target
    return "met" if ok else "missed"


def _spread(r: dict[str, Any]) -> str:
    return f"{r['ratio_p25']:.2f}-{r['ratio_p75']:.2f}"


def micro_markdown(rows: list[dict[str, Any]]) -> str:
    """The micro table with issue 11's targets."""
    body = []
    for r in rows:
        if "error" in r:
            body.append([r["case"], "error: " + r["error"]] + [""] * 7)
            continue
        _, kind, target = MICRO[r["case"]]
        vs_copy = r["autoclust_ms"] / r["copy_ms"] if "copy_ms" in r else None
        value = vs_copy if kind == "copy" else r["ratio"]
        goal = f"<= {target:g}x of a NumPy copy" if kind == "copy" else f">= {target:g}x"
        body.append([r["title"], timing.fmt_ms(r["ort_ms"]), timing.fmt_ms(r["autoclust_ms"]),
                     f"**{r['ratio']:.2f}x**", _spread(r), timing.fmt_ms(r.get("copy_ms")),
                     "" if vs_copy is None else f"{vs_copy:.2f}x", goal,
                     _verdict(value, kind, target)])
    return timing.table(["case", "onnxruntime ms", "autoclust ms", "ratio", "ratio p25-p75",
                         "NumPy copy ms", "autoclust / copy", "target", ""], body, "lrrrrrrll")


def zoo_markdown(rows: list[dict[str, Any]]) -> str:
    """The zoo table, main job first, with a geomean row."""
    body = []
    for r in rows:
        if "error" in r:
            body.append([r["model"], "error: " + r["error"]] + [""] * 8)
            continue
        body.append([r["model"], r["feeds"], f"{r['ort_ms'] * 1e3:.1f}",
                     f"{r['autoclust_ms'] * 1e3:.1f}", f"**{r['ratio']:.2f}x**", _spread(r),
                     f"{r['clusters']} / {r['segments']} / {r['kernels']}",
                     f"{r['first_run_ms']:.0f}", f"{r['max_abs_err']:.1e}",
                     _verdict(r["ratio"], "ratio", ZOO_TARGET)])
    ok = [r["ratio"] for r in rows if "ratio" in r]
    if len(ok) > 1:
        body.append(["geomean", "", "", "", f"**{timing.geomean(ok):.2f}x**"] + [""] * 5)
    return timing.table(["model", "feeds (committed dims)", "onnxruntime us", "autoclust us",
                         "ratio", "ratio p25-p75", "clusters / segments / kernels",
                         "first run ms", "max abs err", f">= {ZOO_TARGET:g}x"], body,
                        "llrrrrrrrl")


def _child(what: str, item: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "autoclust.tools.bench.zoo", f"--one-{what}", item,
           "--threads", str(args.threads), "--rounds", str(args.rounds), f"--flags={args.flags}"]
    if args.block:
        cmd += ["--block", str(args.block)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        key = "case" if what == "micro" else "model"
        name = item if what == "micro" else os.path.basename(item)[:-len(".onnx")]
        return {key: name, "error": tail[:300]}
    return json.loads(lines[-1])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autoclust bench --zoo | --micro",
                                description=__doc__.splitlines()[0])
    p.add_argument("--zoo", action="store_true", help="the committed zoo table")
    p.add_argument("--micro", action="store_true", help="issue 11's micro table")
    p.add_argument("--models", default="", help="zoo names or micro cases (comma-separated)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--block", type=int, default=0, help="timed runs per block (default: "
                   "5 for the zoo, 3 for micro cases)")
    p.add_argument("--flags", default="", help="AUTOCLUST_FLAGS for the autoclust side")
    p.add_argument("--out", default="bench_out")
    p.add_argument("--one-zoo", default="", help=argparse.SUPPRESS)
    p.add_argument("--one-micro", default="", help=argparse.SUPPRESS)
    return p


def _run_table(what: str, items: list[str], args: argparse.Namespace) -> str:
    rows = []
    for item in items:
        row = _child(what, item, args)
        rows.append(row)
        name = row.get("case") or row.get("model")
        print(f"{name:18s} " + (f"ort {row['ort_ms']:9.3f} ms  autoclust {row['autoclust_ms']:9.3f}"
                                f" ms  ratio {row['ratio']:5.2f}x" if "ratio" in row
                                else f"error: {row['error']}"), flush=True)
    text = micro_markdown(rows) if what == "micro" else zoo_markdown(rows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{what}.json"), "w") as f:
        json.dump({"threads": args.threads, "rounds": args.rounds, "rows": rows,
                   "load_after": timing.load_note()}, f, indent=2)
    with open(os.path.join(args.out, f"{what}.md"), "w") as f:
        f.write(text)
    return text + f"wrote {args.out}/{what}.json, {what}.md\n"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.one_zoo:
        print(json.dumps(zoo_row(args.one_zoo, args.threads, args.rounds, args.block or 5,
                                 args.flags)))
        return 0
    if args.one_micro:
        print(json.dumps(micro_row(args.one_micro, args.threads, args.rounds, args.block or 3,
                                   args.flags)))
        return 0
    names = [m for m in args.models.split(",") if m]
    by_name = {os.path.basename(p)[:-len(".onnx")]: p for p in zoo_models()}
    unknown = [n for n in names if n not in MICRO and n not in by_name]
    if unknown:
        print(f"unknown model(s) or case(s) {unknown}; zoo: {', '.join(by_name)}; micro: "
              f"{', '.join(MICRO)}", file=sys.stderr)
        return 2
    if args.micro:
        cases = [n for n in names if n in MICRO] or list(MICRO)
        print(_run_table("micro", cases, args), end="")
    if args.zoo or not args.micro:
        chosen = [by_name[n] for n in names if n in by_name] or list(by_name.values())
        print(_run_table("zoo", chosen, args), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
