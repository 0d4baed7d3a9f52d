"""The GPU backend's first run on a real GPU: one script, one call of the device tool.

    pip install --no-deps --no-build-isolation -e . ; \\
    python -m autoclust.tools.debug.first_light --out "$OUT"      # ~5 minutes on an H100

Each step is timed and may fail on its own (the next ones still run); the results go to
OUT/first_light.json, a table to OUT/first_light.md, the long outputs to OUT/*.log:

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

Every figure names the GPU (doctor). A step's "ok" is its check; its numbers are the
figures to report.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

STEPS: list[tuple[str, Callable[[str], dict[str, Any]]]] = []
PYTEST_TIMEOUT = 300
BENCH_TIMEOUT = 150


def step(name: str) -> Callable:
    def register(fn: Callable[[str], dict[str, Any]]) -> Callable:
        STEPS.append((name, fn))
        return fn
    return register


def _run(cmd: list[str], out: str, log: str, timeout: int) -> dict[str, Any]:
    """A subprocess with its output in OUT/log; rc and the last lines."""
    t0 = time.perf_counter()
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
    r = _run([sys.executable, "-m", "autoclust.tools.cli", "doctor", "--device", "gpu",
              "--json"], out, "doctor.log", 180)
    try:
        with open(os.path.join(out, "doctor.log")) as f:
            text = f.read()
        r["report"] = json.loads(text[text.index("{"):text.rindex("}") + 1])
    except ValueError:
        pass
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
    return _run([sys.executable, "-c", CUBLAS_PROBE], out, "cublas_no_torch.log", 120)


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

    from autoclust.compile import lower_graph, optimize, specialize
    from autoclust.flags import parse
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
    """The fused kernel against onnxruntime (small, float32 and float16, causal or not),
    then its time at seq 2048, head dim 128, float16 against torch's SDPA on this GPU."""
    import onnxruntime as ort
    rows, ok = {}, True
    for dtype, causal in ((TensorProto.FLOAT, False), (TensorProto.FLOAT, True),
                          (TensorProto.FLOAT16, True)):
        m = attention_model(2, 4, 77, 64, dtype, causal)
        rng = np.random.default_rng(0)
        np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
        feeds = {n: rng.standard_normal((2, 4, 77, 64)).astype(np_dtype) for n in "qkv"}
        sess = _session(m)
        got = sess.run(None, feeds)[0].astype(np.float64)
        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]
                                    ).run(None, feeds)[0].astype(np.float64)
        fused = sum(1 for r in sess._runtime.compiled_clusters() for e in r.cache.values()
                    for t in e.program.thunks if getattr(t, "op", "") == "FusedAttention")
        err = float(np.max(np.abs(got - want)))
        tol = 2e-3 if dtype == TensorProto.FLOAT16 else 1e-4
        rows[f"{np.dtype(np_dtype).name}{'-causal' if causal else ''}"] = {"max_abs_err": err,
                                                                     "fused": fused}
        ok = ok and err < tol and fused == 1
    return {"ok": ok, "checks": rows, "timing": _attention_timing()}


def _attention_timing() -> dict[str, Any]:
    """ms of the fused kernel (one session run, device arrays) and of torch's SDPA at
    batch 1, 16 heads, seq 2048, head dim 128, float16, causal, on this GPU."""
    from autoclust.backends.gpu import device
    from autoclust.tools.bench.gpu import event_ms
    cp = device.cupy()
    shape = (1, 16, 2048, 128)
    m = attention_model(*shape[:3], shape[3], TensorProto.FLOAT16, True)
    rng = np.random.default_rng(0)
    dev = {n: cp.asarray(rng.standard_normal(shape).astype(np.float16)) for n in "qkv"}
    sess = _session(m)
    def run() -> None:
        sess.run(None, dev, output_device="gpu")

    r: dict[str, Any] = {"shape": list(shape), "autoclust_ms": event_ms(run, 10)}
    try:
        import torch
        if torch.cuda.is_available():
            q, k, v = (torch.from_dlpack(dev[n]) for n in "qkv")
            sdpa = torch.nn.functional.scaled_dot_product_attention
            r["torch_sdpa_ms"] = event_ms(lambda: sdpa(q, k, v, is_causal=True), 10)
            r["ratio_vs_sdpa"] = r["autoclust_ms"] / r["torch_sdpa_ms"]
    except Exception as exc:  # noqa: BLE001 - the figure is optional, the check is not
        r["torch_error"] = f"{type(exc).__name__}: {exc}"
    return r


@step("zoo")
def zoo_step(out: str) -> dict[str, Any]:
    import onnxruntime as ort
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
        ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
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
    return _run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                 "--maxfail=30", "-rf", "tests"], out, "pytest_gpu.log", PYTEST_TIMEOUT)


@step("bench_kernels")
def bench_step(out: str) -> dict[str, Any]:
    r = _run([sys.executable, "-m", "autoclust.tools.cli", "bench", "--device", "gpu",
              "--cases", "kernels", "--out", out], out, "bench_kernels.log", BENCH_TIMEOUT)
    path = os.path.join(out, "bench_gpu.json")
    if os.path.exists(path):
        with open(path) as f:
            r["rows"] = json.load(f).get("kernels")
    return r


# ---- driver ---------------------------------------------------------------------------------

def run_steps(out: str, only: list[str] | None = None) -> dict[str, Any]:
    """Run the steps (all, or `only`), each on its own; the results by step name."""
    results: dict[str, Any] = {}
    for name, fn in STEPS:
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        try:
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
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    results = run_steps(args.out, [s for s in args.only.split(",") if s])
    with open(os.path.join(args.out, "first_light.md"), "w") as f:
        f.write(summary(results))
    return 0 if all(r.get("ok") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
