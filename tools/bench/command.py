"""`autoclust bench`: autoclust against onnxruntime, alternating in one process.

    autoclust bench                       # every case, writes bench_out/bench.{json,md,png}
    autoclust bench --cases chain16,gelu --repeat 20 --threads 2
    python -m autoclust.tools.bench.command --quick
    autoclust bench --exports | --zoo | --micro | --profile MODEL   (issue 11's tables:
        tools/bench/exports.py, bench_zoo.py, bench_profile.py; each takes --help)
    autoclust bench --torch     torch.compile on transformers modules (tools/bench/torch.py)

Each case runs in its own subprocess (so its peak RSS is its own): onnxruntime
(ORT_ENABLE_ALL, `--threads` intra-op threads) and autoclust (same threads) are timed
alternately, run by run, and the medians and their ratio (onnxruntime / autoclust: above 1
means autoclust is faster) are reported with autoclust's compile time (its first run
minus a steady run) and, for elementwise cases, the time of a NumPy copy of the same
bytes (the memory-bandwidth floor).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

import numpy as np

# name -> (zoo model, builder kwargs, feed dims, copy-floor bytes read, or 0)
CASES: dict[str, tuple[str, dict | str, dict, int]] = {
    # chain16: 16 cheap ops (one memory pass each in onnxruntime); chain16_math: the zoo's
    # chain with Tanh, Sqrt, Exp and Sigmoid in it (compute-bound once fused).
    "chain16": ("elementwise_chain", {"chain_len": 16, "math": False}, {"n": 16 * 2**20},
                16 * 2**20 * 4),
    "chain16_math": ("elementwise_chain", {"chain_len": 16}, {"n": 16 * 2**20},
                     16 * 2**20 * 4),
    "gelu": ("gelu", {}, {"n": 16 * 2**20}, 16 * 2**20 * 4),
    "layernorm": ("layernorm", {"d": 768}, {"batch": 32, "seq": 128}, 0),
    "softmax_mask": ("softmax_mask", {"heads": 12}, {"batch": 16, "seq": 128}, 0),
    "rmsnorm_gate": ("rmsnorm_gate", {"d": 1024}, {"n": 4096}, 0),
    # zoo models at their "bench" presets (sizes in models/zoo.py PRESETS)
    "mlp_gelu": ("mlp_gelu", "bench", {}, 0),
    "bert_encoder": ("bert_encoder", "bench", {}, 0),
    "llama_block": ("llama_block", "bench", {}, 0),
    "resnet_block": ("resnet_block", "bench", {}, 0),
    "diffusion_block": ("diffusion_block", "bench", {}, 0),
    "mixed_dynamic": ("mixed_dynamic", "bench", {}, 0),
}
QUICK = ("chain16", "chain16_math", "gelu", "layernorm", "softmax_mask", "rmsnorm_gate")


def _build(case: str) -> tuple[Any, dict[str, np.ndarray]]:
    from autoclust.models import zoo
    name, kwargs, dims, _ = CASES[case]
    if kwargs == "bench":
        model = zoo.build(name, preset="bench")
    else:
        model = zoo.build(name, **kwargs)
    return model, zoo.feeds(model, dims=dims or None)


def run_case(case: str, repeat: int, threads: int, flags: str) -> dict[str, Any]:
    """Time one case in this process; returns a result row."""
    from autoclust.tools.bench import timing

    import autoclust
    from autoclust import flags as flags_mod
    model, feeds = _build(case)
    ref = timing.ort_session(model, threads)
    overrides = flags_mod.parse_string(flags)
    overrides.setdefault("threads", threads)
    t0 = time.perf_counter()
    # The same SessionOptions as the baseline: onnxruntime segments (and a pass-through
    # session when nothing clusters) run exactly as the baseline does.
    sess = autoclust.InferenceSession(model, ref.get_session_options(), **overrides)
    t_session = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours = sess.run(None, feeds)
    t_first = time.perf_counter() - t0
    want = ref.run(None, feeds)
    err = max((float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
               if a.size else 0.0) for a, b in zip(ours, want))
    t_ort, t_ac = [], []
    for _ in range(repeat):  # alternate so drift and noise hit both sides alike
        t0 = time.perf_counter()
        ref.run(None, feeds)
        t_ort.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        sess.run(None, feeds)
        t_ac.append(time.perf_counter() - t0)
    ort_ms = float(np.median(t_ort)) * 1e3
    ac_ms = float(np.median(t_ac)) * 1e3
    row = {"case": case, "ort_ms": ort_ms, "autoclust_ms": ac_ms, "ratio": ort_ms / ac_ms,
           "compile_ms": max(t_first * 1e3 - ac_ms, 0.0), "session_ms": t_session * 1e3,
           "max_abs_err": err, "threads": threads,
           "clusters": len(sess.plan.clusters) if sess.plan else 0,
           "kernels": [k for c in sess.stats()["clusters"] for k in c["kernels"]],
           "fallbacks": [c["fallback"] for c in sess.stats()["clusters"] if c["fallback"]],
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    nbytes = CASES[case][3]
    if nbytes:
        src = np.ones(nbytes // 4, np.float32)
        dst = np.empty_like(src)
        copies = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            copies.append(time.perf_counter() - t0)
        row["copy_ms"] = float(np.median(copies)) * 1e3
        row["vs_copy"] = ac_ms / row["copy_ms"]
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [("| case | onnxruntime ms | autoclust ms | ratio | compile ms | kernels | "
              "vs NumPy copy | max abs err | peak RSS MB |"),
             "|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | error: {r['error']} |||||||")
            continue
        vs_copy = f"{r['vs_copy']:.2f}x" if "vs_copy" in r else ""
        lines.append(f"| {r['case']} | {r['ort_ms']:.2f} | {r['autoclust_ms']:.2f} | "
                     f"**{r['ratio']:.2f}x** | {r['compile_ms']:.0f} | {r['kernels']} | "
                     f"{vs_copy} | {r['max_abs_err']:.1e} | {r['peak_rss_mb']:.0f} |")
    return "\n".join(lines) + "\n"


def _chart(rows: list[dict[str, Any]], path: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ok = [r for r in rows if "ratio" in r]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(ok) + 1))
    ax.barh([r["case"] for r in ok], [r["ratio"] for r in ok])
    ax.axvline(1.0, color="k", lw=1)
    ax.set_xlabel("onnxruntime time / autoclust time (higher is better)")
    fig.tight_layout()
    fig.savefig(path)
    return True


def parser() -> argparse.ArgumentParser:
    """The options of `autoclust bench`."""
    p = argparse.ArgumentParser(prog="autoclust bench", description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="", help=f"comma-separated cases (default: all of "
                                               f"{', '.join(CASES)})")
    p.add_argument("--quick", action="store_true",
                   help=f"only the kernel cases: {', '.join(QUICK)}")
    p.add_argument("--repeat", type=int, default=15, metavar="N",
                   help="timed runs of each side per case (default 15)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, metavar="N",
                   help="intra-op threads of both sides (default: the CPU count)")
    p.add_argument("--flags", default="", help="AUTOCLUST_FLAGS for the autoclust side")
    p.add_argument("--out", default="bench_out", metavar="DIR",
                   help="folder for bench.json, bench.md, bench.png (default bench_out)")
    p.add_argument("--log", action="store_true",
                   help="progress lines when stderr is not a terminal (a bar when it is)")
    p.add_argument("--exports", action="store_true",
                   help="the real-export table (tools/bench/exports.py; --help there)")
    p.add_argument("--zoo", action="store_true",
                   help="the zoo table at committed sizes (tools/bench/zoo.py)")
    p.add_argument("--micro", action="store_true", help="the micro table (tools/bench/zoo.py)")
    p.add_argument("--profile", metavar="MODEL", default=None,
                   help="per-step and per-thunk times beside onnxruntime's own profile "
                        "(tools/bench/profile.py)")
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu"],
                   help="gpu: the GPU benchmark and its own options (autoclust/tools/bench_gpu.py)")
    p.add_argument("--one", default="", help=argparse.SUPPRESS)  # internal: run one case
    return p


def _run_one(case: str, args: argparse.Namespace) -> dict[str, Any]:
    """One case in its own process (its peak RSS is its own); a row, or {case, error}."""
    cmd = [sys.executable, "-m", "autoclust.tools.bench.command", "--one", case, "--repeat",
           str(args.repeat), "--threads", str(args.threads), f"--flags={args.flags}"]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        return {"case": case, "error": tail[:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# first argument -> the module that owns it (it parses the rest of the arguments)
SUBCOMMANDS = {"--exports": "exports", "--zoo": "zoo", "--micro": "zoo",
               "--profile": "profile", "--torch": "torch"}


def main(argv: list[str] | None = None) -> int:
    """Entry point of `autoclust bench`."""
    from autoclust.tools.bench import (
        gpu as bench_gpu,  # `autoclust bench --device gpu`: its own cases
    )

    from autoclust.report.progress import Progress
    argv = sys.argv[1:] if argv is None else list(argv)
    if bench_gpu.device_of(argv) == "gpu":
        return bench_gpu.main(argv)
    for flag, module in SUBCOMMANDS.items():
        if flag in argv:
            import importlib
            rest = argv if module == "zoo" else [a for a in argv if a != flag]
            return importlib.import_module(f"autoclust.tools.bench.{module}").main(rest)
    args = parser().parse_args(argv)
    if args.one:
        print(json.dumps(run_case(args.one, args.repeat, args.threads, args.flags)))
        return 0
    cases = [c for c in args.cases.split(",") if c] or list(QUICK if args.quick else CASES)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        print(f"autoclust bench: unknown case(s) {unknown}; known: {', '.join(CASES)}",
              file=sys.stderr)
        return 2
    rows = []
    with Progress("autoclust bench", total=len(cases), unit="case", log=args.log, delay=0,
                  stream=sys.stderr) as bar:
        for case in cases:
            bar.start(case)
            rows.append(_run_one(case, args))
            bar.update()
            r = rows[-1]
            # results go to stdout (above the bar on a terminal)
            line = f"{case:16s} " + (
                f"ort {r['ort_ms']:9.2f} ms  autoclust {r['autoclust_ms']:9.2f} ms  ratio "
                f"{r['ratio']:6.2f}x  compile {r['compile_ms']:.0f} ms" if "ratio" in r
                else f"error: {r['error']}")
            bar.write(line, stream=sys.stdout)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(rows, f, indent=2)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(markdown(rows))
    drew = _chart(rows, os.path.join(args.out, "bench.png"))
    print(f"wrote {args.out}/bench.json, bench.md" + (", bench.png" if drew else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
