"""The GPU backend's first run on a real GPU: one script, one call of the device tool.

    PYTHONPATH=$PWD PYTHONUNBUFFERED=1 python3 -m autoclust.tools.debug.first_light \\
        --out "$OUT" --budget 480

(from the repository root, nothing installed: the image's python3 has CuPy, torch,
onnxruntime, llvmlite and ml_dtypes). Each step is timed and may fail on its own (the next
ones still run); a step that would start with less than its minimum of the --budget left
is skipped and says so. The results go to OUT/first_light.json (rewritten after every
step, so a killed run keeps what it did), a table to OUT/first_light.md, the long outputs
to OUT/*.log: five files, inside the device tool's eight.

    doctor             `autoclust doctor --device gpu --json` in a fresh process
    cublas_no_torch    libcublas located and loaded in a process that never imports torch
    denormals          a kernel keeps float32 denormals (NVRTC without -ftz)
    split_row_bits     a split-row ReduceSum of [2, 4M] twice: identical bits, and the
                       error against a float64 sum
    gemm               MatMuls against float64: float32 (CUBLAS_COMPUTE_32F), with
                       --allow_tf32, float16 and bfloat16 (float32 accumulation)
    attention          the fused attention kernel against onnxruntime (causal and padding
                       masks, a fully masked row, float16)
    zoo                every zoo model three times against onnxruntime: --must_compile where
                       every node clusters on the GPU, kernel counts, CUDA graph replays
    pytest_gpu         `pytest -m gpu tests` (every op and edge case under five launches)
    bench_kernels      `autoclust bench --device gpu --cases kernels`: bandwidth fractions
    bench_models       `autoclust bench --device gpu --cases bert,gpt2` (or --models):
                       float16, float32 against torch eager and torch.compile, with
                       whatever time is left

Every figure names the GPU (doctor). A step's "ok" is its check; its numbers are the
figures to report.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

STEPS: list[tuple[str, Callable[[str], dict[str, Any]]]] = []
# Subprocess steps: their command lines, their own time limits (seconds), and the least
# time left in the budget for which a step is started at all. Tests swap PYTHON for a
# launcher that installs the GPU stand-in, and shrink the arguments.
PYTHON = [sys.executable]
# only tests/gpu/test_gpu.py carries the gpu mark: collecting all of tests/ would import modules
# whose packages (ray, ...) the GPU image may lack, and one collection error stops pytest
PYTEST_ARGS = ["-m", "gpu", "-n", "4", "--maxfail=30", "-rf", "tests/gpu/test_gpu.py"]
BENCH_KERNEL_ARGS = ["--cases", "kernels"]
BENCH_MODEL_ARGS = ["--cases", "bert,gpt2", "--dtypes", "float16,float32", "--repeat", "20"]
TIMEOUTS = {"doctor": 120, "cublas_no_torch": 60, "pytest_gpu": 240, "bench_kernels": 120,
            "bench_models": 600}
MIN_LEFT = {"pytest_gpu": 60, "bench_kernels": 40, "bench_models": 60}
ATTENTION_SHAPE = (1, 16, 2048, 128)  # the timing's Q, K, V: issue 22's target shape
_DEADLINE = [float("inf")]  # perf_counter() time by which every step must have ended


def _left() -> float:
    return _DEADLINE[0] - time.perf_counter()


def step(name: str) -> Callable:
    def register(fn: Callable[[str], dict[str, Any]]) -> Callable:
        STEPS.append((name, fn))
        return fn
    return register


def _run(cmd: list[str], out: str, log: str, timeout: float) -> dict[str, Any]:
    """A subprocess with its output in OUT/log (cut to the budget left); rc and the last
    lines."""
    t0 = time.perf_counter()
    timeout = max(1.0, min(timeout, _left() - 5))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(),
                                                      os.environ.get("PYTHONPATH", "")]))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              check=False)
        text, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        text = f"{exc.stdout or ''}{exc.stderr or ''}\nTIMEOUT after {timeout} s"
        text, rc = text if isinstance(text, str) else str(text), 124
    with open(os.path.join(out, log), "w") as f:
        f.write(text)
    return {"ok": rc == 0, "rc": rc, "seconds": time.perf_counter() - t0,
            "tail": text.strip().splitlines()[-12:]}


def _model(nodes: list, inputs: list, outputs: list, inits: list | None = None
           ) -> onnx.ModelProto:
    m = helper.make_model(helper.make_graph(nodes, "first_light", inputs, outputs, inits or []),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def _info(name: str, dtype: int, shape: list) -> Any:
    return helper.make_tensor_value_info(name, dtype, shape)


# ---- steps ----------------------------------------------------------------------------------

@step("doctor")
def doctor_step(out: str) -> dict[str, Any]:
    r = _run([*PYTHON, "-m", "autoclust.tools.cli", "doctor", "--device", "gpu", "--json"],
             out, "doctor.log", TIMEOUTS["doctor"])
    path = os.path.join(out, "doctor.log")
    with open(path) as f:
        text = f.read()
    os.remove(path)  # kept in first_light.json: the device tool brings back eight files
    try:
        r["report"] = json.loads(text[text.index("{"):text.rindex("}") + 1])
    except ValueError:
        r["output"] = text[-4000:]
    return r


CUBLAS_PROBE = """
import sys
from autoclust.backends.gpu import blas
lib = blas.get()
print(lib.path if lib else "MISSING: " + blas.reason())
print("torch imported:", "torch" in sys.modules)
sys.exit(0 if lib is not None and "torch" not in sys.modules else 1)
"""


@step("cublas_no_torch")
def cublas_step(out: str) -> dict[str, Any]:
    r = _run([*PYTHON, "-c", CUBLAS_PROBE], out, "cublas_no_torch.log",
             TIMEOUTS["cublas_no_torch"])
    os.remove(os.path.join(out, "cublas_no_torch.log"))  # its tail is in the result
    return r


def _session(model: onnx.ModelProto, **kw: Any) -> Any:
    import autoclust
    return autoclust.InferenceSession(model, device="gpu", must_compile=True, **kw)


@step("denormals")
def denormals_step(out: str) -> dict[str, Any]:
    x = np.array([1e-40, -3e-42, 1e-38, 5e-45], np.float32)
    m = _model([helper.make_node("Neg", ["x"], ["y"]), helper.make_node("Mul", ["y", "y"], ["z"])],
               [_info("x", TensorProto.FLOAT, [4])],
               [_info("y", TensorProto.FLOAT, [4]), _info("z", TensorProto.FLOAT, [4])])
    y, z = _session(m, min_cluster_size=1).run(None, {"x": x})
    return {"ok": bool(np.array_equal(y, -x)), "y": y.tolist(), "z": z.tolist()}


@step("split_row_bits")
def split_row_step(out: str) -> dict[str, Any]:
    n = 1 << 22
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, n)).astype(np.float32)
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    m = _model([helper.make_node("ReduceSum", ["x", "axes"], ["y"])],
               [_info("x", TensorProto.FLOAT, [2, n])], [_info("y", TensorProto.FLOAT, [2, 1])],
               [axes])
    sess = _session(m, min_cluster_size=1)
    first, second = (sess.run(None, {"x": x})[0] for _ in range(2))
    exact = x.astype(np.float64).sum(axis=1, keepdims=True)
    kernels = sess._runtime.compiled_clusters()[0]
    exe = next(iter(kernels.cache.values()))
    launches = exe.rendered.launch_text(exe.program)
    return {"ok": first.tobytes() == second.tobytes() and "split-row" in launches,
            "identical_bits": first.tobytes() == second.tobytes(),
            "rel_err_vs_float64": float(np.max(np.abs(first - exact) / np.abs(exact))),
            "launch": [line.strip() for line in launches.splitlines()[1:]]}


def _gemm_error(dtype: str, allow_tf32: bool = False) -> float:
    """max |C - C64| / max |C64| of a [256, 512] @ [512, 384] MatMul compiled for the GPU."""
    import ml_dtypes
    from autoclust.backends import gpu
    from autoclust.importers.onnx import import_model

    from autoclust.compile import lower_graph
    from autoclust.flags import parse
    from autoclust.passes.optimize import optimize
    from autoclust.passes.specialize import specialize
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    onnx_type = helper.np_dtype_to_tensor_dtype(np_dtype)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((256, 512)).astype(np_dtype)
    b = rng.standard_normal((512, 384)).astype(np_dtype)
    m = _model([helper.make_node("MatMul", ["a", "b"], ["c"])],
               [_info("a", onnx_type, [256, 512]), _info("b", onnx_type, [512, 384])],
               [_info("c", onnx_type, [256, 384])])
    flags = parse("", allow_tf32=allow_tf32)
    graph = optimize(specialize(import_model(m), [(a.dtype, a.shape), (b.dtype, b.shape)], {}),
                     flags)
    exe = gpu.compile(lower_graph(graph, flags, gpu), flags)
    c = gpu.to_host(exe.run([a, b])[0]).astype(np.float64)
    want = a.astype(np.float64) @ b.astype(np.float64)
    return float(np.max(np.abs(c - want)) / np.max(np.abs(want)))


@step("gemm")
def gemm_step(out: str) -> dict[str, Any]:
    errs = {"float32": _gemm_error("float32"), "float32_tf32": _gemm_error("float32", True),
            "float16": _gemm_error("float16"), "bfloat16": _gemm_error("bfloat16")}
    # float32 accumulation: ~1e-6 in float32; TF32 inputs ~1e-3; half inputs round first
    ok = errs["float32"] < 1e-5 and errs["float16"] < 2e-3 and errs["bfloat16"] < 2e-2
    return {"ok": ok, "rel_err": errs}


def attention_model(b: int, h: int, s: int, d: int, dtype: int, causal: bool) -> onnx.ModelProto:
    """softmax(Q K^T / sqrt(d) (+ a causal Where)) V over inputs Q, K, V [b, h, s, d]."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]),
             helper.make_node("Mul", ["s0", "c"], ["s1"])]
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    inits = [onnx.numpy_helper.from_array(np.array(d ** -0.5, np_dtype), "c")]
    last = "s1"
    if causal:
        tri = np.tril(np.ones((s, s), bool))
        inits += [onnx.numpy_helper.from_array(tri, "tri"),
                  onnx.numpy_helper.from_array(np.array(-np.inf, np_dtype), "fill")]
        nodes.append(helper.make_node("Where", ["tri", "s1", "fill"], ["s2"]))
        last = "s2"
    nodes += [helper.make_node("Softmax", [last], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"])]
    ins = [_info(n, dtype, [b, h, s, d]) for n in "qkv"]
    return _model(nodes, ins, [_info("y", dtype, [b, h, s, d])], inits)


@step("attention")
def attention_step(out: str) -> dict[str, Any]:
    """The fused kernel against onnxruntime (small, float32 and float16, causal or not;
    float16 and bfloat16 also on tensor cores, --gpu_mma_attention, two key tiles and
    more), then its time at seq 2048, head dim 128, float16 against torch's SDPA on this
    GPU, both kernels."""
    from autoclust.backends.ort import ORIGINAL_SESSION
    rows, ok = {}, True
    cases = [(TensorProto.FLOAT, False, False), (TensorProto.FLOAT, True, False),
             (TensorProto.FLOAT16, True, False), (TensorProto.FLOAT16, True, True),
             (TensorProto.FLOAT16, False, True), (TensorProto.BFLOAT16, True, True)]
    for dtype, causal, mma in cases:
        m = attention_model(2, 4, 150, 64, dtype, causal)
        rng = np.random.default_rng(0)
        np_dtype = helper.tensor_dtype_to_np_dtype(dtype)  # bfloat16: ml_dtypes'
        feeds = {n: rng.standard_normal((2, 4, 150, 64)).astype(np_dtype) for n in "qkv"}
        sess = _session(m, gpu_mma_attention=mma)
        got = np.asarray(sess.run(None, feeds)[0]).astype(np.float64)
        if dtype == TensorProto.BFLOAT16:  # no bfloat16 MatMul in onnxruntime's CPU provider
            ref = attention_model(2, 4, 150, 64, TensorProto.FLOAT, causal)
            ref_feeds = {n: a.astype(np.float32) for n, a in feeds.items()}
        else:
            ref, ref_feeds = m, feeds
        want = ORIGINAL_SESSION(ref.SerializeToString(), providers=["CPUExecutionProvider"]
                                ).run(None, ref_feeds)[0].astype(np.float64)
        fused = sum(1 for r in sess._runtime.compiled_clusters() for e in r.cache.values()
                    for t in e.program.thunks if getattr(t, "op", "") == "FusedAttention")
        err = float(np.max(np.abs(got - want)))
        tol = {TensorProto.FLOAT: 1e-4, TensorProto.FLOAT16: 2e-3}.get(dtype, 2e-2)
        name = np.dtype(np_dtype).name + ("-causal" if causal else "") + ("-mma" if mma else "")
        rows[name] = {"max_abs_err": err, "fused": fused}
        ok = ok and err < tol and fused == 1
    timing = {"cuda_cores": _attention_timing(False), "tensor_cores": _attention_timing(True)}
    return {"ok": ok, "checks": rows, "timing": timing}


def _attention_timing(mma: bool) -> dict[str, Any]:
    """ms of the fused kernel (its launch alone, and one session run on device arrays,
    host overhead included) and of torch's SDPA at batch 1, 16 heads, seq 2048, head dim
    128, float16, causal, on this GPU; mma: --gpu_mma_attention."""
    from autoclust.backends.gpu import device
    from autoclust.tools.bench.gpu import event_ms
    cp = device.cupy()
    shape = ATTENTION_SHAPE
    m = attention_model(*shape[:3], shape[3], TensorProto.FLOAT16, True)
    rng = np.random.default_rng(0)
    host = {n: rng.standard_normal(shape).astype(np.float16) for n in "qkv"}
    dev = {n: cp.asarray(a) for n, a in host.items()}
    sess = _session(m, gpu_mma_attention=mma)
    def run() -> None:
        sess.run(None, dev, output_device="gpu")

    run()  # compiles: the cluster's executable exists from here on
    runner = sess._runtime.compiled_clusters()[0]
    exe = next(iter(runner.cache.values()))
    args, outs = [dev[n] for n in runner.input_names], exe.prepare()
    r: dict[str, Any] = {"shape": list(shape), "session_ms": event_ms(run, 10),
                         "autoclust_ms": event_ms(lambda: exe.launch(args, outs), 10),
                         "kernels": exe.num_kernels}
    try:
        import torch
        if torch.cuda.is_available():
            q, k, v = (torch.from_dlpack(dev[n]) for n in "qkv")
            sdpa = torch.nn.functional.scaled_dot_product_attention
            r["torch_sdpa_ms"] = event_ms(lambda: sdpa(q, k, v, is_causal=True), 10)
            r["ratio_vs_sdpa"] = r["autoclust_ms"] / r["torch_sdpa_ms"]
            got = torch.from_dlpack(sess.run(None, dev, output_device="gpu")[0]).float()
            r["max_abs_diff_vs_sdpa"] = float((got - sdpa(q, k, v, is_causal=True).float()
                                               ).abs().max())
    except Exception as exc:  # noqa: BLE001 - the figure is optional, the check is not
        r["torch_error"] = f"{type(exc).__name__}: {exc}"
    return r


@step("zoo")
def zoo_step(out: str) -> dict[str, Any]:
    from autoclust.backends.ort import ORIGINAL_SESSION
    from autoclust.models import zoo

    import autoclust
    from autoclust.errors import NotCompilableError
    rows, ok = {}, True
    for name in zoo.BUILDERS:
        model = zoo.build(name)
        try:
            sess, strict = _session(model), True
        except NotCompilableError as exc:  # Conv and pooling stay in onnxruntime here
            sess, strict = autoclust.InferenceSession(model, device="gpu"), str(exc)[:200]
        ref = ORIGINAL_SESSION(model.SerializeToString(), providers=["CPUExecutionProvider"])
        err = 0.0
        for seed in range(3):
            feeds = zoo.feeds(model, seed=seed)
            for g, w in zip(sess.run(None, feeds), ref.run(None, feeds)):
                err = max(err, float(np.max(np.abs(np.asarray(g, np.float64) - w),
                                            initial=0.0)))
        graphs = sess._runtime.device.graphs if sess._runtime is not None else None
        fallbacks = [r.fallback_reason for r in (sess._runtime.compiled_clusters()
                                                 if sess._runtime else []) if r.fallback]
        rows[name] = {"must_compile": strict, "max_abs_err": err, "fallbacks": fallbacks,
                      "kernels": [c["kernels"] for c in sess.stats()["clusters"]],
                      "graph_replays": graphs.replays if graphs else None,
                      "graph_reason": graphs.reason if graphs else None}
        ok = ok and err < 1e-3 and not fallbacks
    return {"ok": ok, "models": rows}


@step("pytest_gpu")
def pytest_step(out: str) -> dict[str, Any]:
    return _run([*PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PYTEST_ARGS], out,
                "pytest_gpu.log", TIMEOUTS["pytest_gpu"])


def _bench(out: str, name: str, args: list[str]) -> dict[str, Any]:
    """`autoclust bench --device gpu ARGS`; its rows read off the log (it prints each as a
    JSON line when done, so a run cut short by the budget keeps the rows it finished)."""
    with tempfile.TemporaryDirectory() as tables:  # bench_gpu.{json,md}: rows are below
        r = _run([*PYTHON, "-m", "autoclust.tools.cli", "bench", "--device", "gpu", *args,
                  "--out", tables], out, f"{name}.log", TIMEOUTS[name])
    rows = []
    with open(os.path.join(out, f"{name}.log")) as f:
        for line in f:
            if line.startswith("{") and '"case"' in line:
                rows.append(json.loads(line))
    r["rows"] = rows
    r["ok"] = r["ok"] and bool(rows) and not any("error" in row for row in rows)
    return r


@step("bench_kernels")
def bench_kernels_step(out: str) -> dict[str, Any]:
    return _bench(out, "bench_kernels", BENCH_KERNEL_ARGS)


@step("bench_models")
def bench_models_step(out: str) -> dict[str, Any]:
    return _bench(out, "bench_models", BENCH_MODEL_ARGS)


# ---- driver ---------------------------------------------------------------------------------

def run_steps(out: str, only: list[str] | None = None, budget: float = float("inf")
              ) -> dict[str, Any]:
    """Run the steps (all, or `only`), each on its own, within `budget` seconds; the
    results by step name."""
    _DEADLINE[0] = time.perf_counter() + budget
    results: dict[str, Any] = {}
    for name, fn in STEPS:
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        try:
            if _left() < MIN_LEFT.get(name, 10):
                r = {"ok": False, "error": f"skipped: {_left():.0f} s of the budget left"}
            else:
                r = fn(out)
        except Exception as exc:  # noqa: BLE001 - one failed step must not stop the others
            r = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                 "traceback": traceback.format_exc().splitlines()[-8:]}
        r.setdefault("seconds", time.perf_counter() - t0)
        results[name] = r
        print(f"{name}: {'ok' if r.get('ok') else 'FAILED'} ({r['seconds']:.1f} s)", flush=True)
        with open(os.path.join(out, "first_light.json"), "w") as f:
            json.dump(results, f, indent=2, default=str)
    return results


def summary(results: dict[str, Any]) -> str:
    """first_light.md: one row per step."""
    lines = ["| step | ok | seconds | detail |", "|---|---|---|---|"]
    for name, r in results.items():
        detail = r.get("error") or json.dumps({k: v for k, v in r.items()
                                               if k not in ("ok", "seconds", "tail", "report",
                                                            "traceback")},
                                              default=str)[:300]
        lines.append(f"| {name} | {'yes' if r.get('ok') else 'NO'} | {r['seconds']:.1f} | "
                     f"{detail} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the first-light steps; 0 when every step passed."""
    p = argparse.ArgumentParser(prog="python -m autoclust.tools.debug.first_light",
                                description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "first_light_out"))
    p.add_argument("--only", default="", help="comma-separated step names")
    p.add_argument("--models", default="",
                   help="bench_models' cases (default bert,gpt2; see autoclust bench --device "
                        "gpu --help)")
    p.add_argument("--reduce-overhead", action="store_true",
                   help="bench_models also times torch.compile(mode='reduce-overhead')")
    p.add_argument("--budget", type=float, default=480.0,
                   help="seconds for all the steps (default 480: the device tool's call "
                        "limit is 600)")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.models:
        BENCH_MODEL_ARGS[1] = args.models
    if args.reduce_overhead:
        BENCH_MODEL_ARGS.append("--reduce-overhead")
    stacks = os.path.join(args.out, "hang_stacks.log")
    with open(stacks, "w") as hang:  # a kernel that never returns leaves its stacks here
        faulthandler.dump_traceback_later(args.budget + 60, exit=True, file=hang)
        try:
            results = run_steps(args.out, [s for s in args.only.split(",") if s], args.budget)
        finally:
            faulthandler.cancel_dump_traceback_later()
    os.remove(stacks)
    with open(os.path.join(args.out, "first_light.md"), "w") as f:
        f.write(summary(results))
    return 0 if all(r.get("ok") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
