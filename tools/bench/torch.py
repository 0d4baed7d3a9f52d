"""torch.compile(backend="autoclust") against eager torch and backend="inductor".

    python -m autoclust.tools.bench.torch                    # every block, 2 threads
    python -m autoclust.tools.bench.torch --cases attention --repeat 21 --no-inductor

Run from a source checkout: the blocks are the ones tests/test_torch_fx.py defines, built
here at benchmark sizes. Each case runs in its own subprocess; eager, autoclust and
inductor are timed alternately (blocks of --runs calls, --repeat rounds) under
torch.no_grad() with torch.set_num_threads(--threads), and the medians are reported with
each compiled variant's first-call time (compile) and its largest difference from eager.
Writes bench_out/bench_torch.{json,md}.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

# case -> block_inputs() arguments at benchmark size
CASES: dict[str, dict[str, int]] = {
    "attention": {"batch": 8, "seq": 128, "d": 256, "heads": 4},
    "llama": {"batch": 8, "seq": 128, "d": 256, "heads": 4},
    "embed": {"batch": 16, "seq": 128, "d": 256},
    "convnet": {"batch": 16, "seq": 16},  # 64x64 images
}
VARIANTS = ("eager", "autoclust", "inductor")


def _blocks() -> Any:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(root, "tests", "test_torch_fx.py")
    if not os.path.exists(path):
        sys.exit(f"bench_torch needs a source checkout: {path} not found")
    spec = importlib.util.spec_from_file_location("test_torch_fx", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _time_case(case: str, repeat: int, runs: int, threads: int, variants: list[str],
               options: dict[str, Any]) -> dict[str, Any]:
    import torch
    from autoclust.importers.torch import fx as torch_fx
    torch.set_num_threads(threads)
    model, args = _blocks().block_inputs(case, **CASES[case])
    out: dict[str, Any] = {"case": case, "sizes": CASES[case], "threads": threads,
                           "options": options}
    fns, compile_s, err = {}, {}, {}
    with torch.no_grad():
        want = model(*args)
        for v in variants:
            fn = model if v == "eager" else torch.compile(
                model, backend=v, options=options if v == "autoclust" else None)
            start = time.perf_counter()
            got = fn(*args)
            compile_s[v] = time.perf_counter() - start
            err[v] = float((got - want).abs().max())
            fns[v] = fn
        times: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(repeat):
            for v, fn in fns.items():
                fn(*args)  # one untimed call: the other variant's caches are cold
                start = time.perf_counter()
                for _ in range(runs):
                    fn(*args)
                times[v].append((time.perf_counter() - start) / runs * 1e3)
    out["ms"] = {v: statistics.median(t) for v, t in times.items()}
    out["compile_s"] = {v: compile_s[v] for v in variants if v != "eager"}
    out["max_abs_err"] = {v: err[v] for v in variants if v != "eager"}
    if "autoclust" in variants:
        (report,) = torch_fx.reports()
        out["clusters"] = len(report.clusters)
        out["eager_nodes"] = len(report.eager)
        out["kernels"] = [k for c in report.clusters for k in c.stats()["kernels"]]
    return out


def _row(r: dict[str, Any]) -> str:
    ms = r["ms"]
    cells = [r["case"], f"{ms['eager']:.2f}", f"{ms['autoclust']:.2f}"]
    cells.append(f"{ms['inductor']:.2f}" if "inductor" in ms else "-")
    cells.append(f"**{ms['eager'] / ms['autoclust']:.2f}x**")
    cells.append(f"{ms['inductor'] / ms['autoclust']:.2f}x" if "inductor" in ms else "-")
    comp = r["compile_s"]
    cells.append(f"{comp['autoclust']:.1f}" + (f" / {comp['inductor']:.1f}"
                                                if "inductor" in comp else ""))
    cells.append(f"{r['clusters']} / {r['eager_nodes']} / {sum(r['kernels'])}")
    cells.append(f"{max(r['max_abs_err'].values()):.1e}")
    return "| " + " | ".join(cells) + " |"


def table(results: list[dict[str, Any]]) -> str:
    """The markdown table of results."""
    head = ("| block | eager ms | autoclust ms | inductor ms | eager / autoclust | "
            "inductor / autoclust | compile s (autoclust / inductor) | "
            "clusters / eager nodes / kernels | max abs err |")
    return "\n".join([head, "|---|---:|---:|---:|---:|---:|---:|---|---:|"] +
                     [_row(r) for r in results])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--repeat", type=int, default=15, help="alternating rounds")
    p.add_argument("--runs", type=int, default=3, help="calls per timed block")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-inductor", action="store_true")
    p.add_argument("--options", default="{}", help='autoclust flags as JSON, e.g. '
                   '\'{"must_compile": true}\'')
    p.add_argument("--out", default="bench_out")
    p.add_argument("--one", help=argparse.SUPPRESS)  # child process: time one case
    a = p.parse_args(argv)
    variants = [v for v in VARIANTS if not (a.no_inductor and v == "inductor")]
    if a.one:
        print(json.dumps(_time_case(a.one, a.repeat, a.runs, a.threads, variants,
                                    json.loads(a.options))))
        return 0
    results = []
    for case in a.cases.split(","):
        cmd = [sys.executable, "-m", "autoclust.tools.bench.torch", "--one", case,
               "--repeat", str(a.repeat), "--runs", str(a.runs), "--threads", str(a.threads),
               "--options", a.options]
        cmd += ["--no-inductor"] if a.no_inductor else []
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if proc.returncode:
            print(f"{case}: failed\n{proc.stderr[-3000:]}", file=sys.stderr)
            continue
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(_row(results[-1]), flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "bench_torch.json"), "w") as f:
        json.dump(results, f, indent=2)
    with open(os.path.join(a.out, "bench_torch.md"), "w") as f:
        f.write(table(results) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
