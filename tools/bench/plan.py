"""Plan overhead and sub-session thread spinning, measured.

    python -m autoclust.tools.bench.plan [--steps 24] [--n 65536] [--repeat 200]

Builds a chain that alternates small clusters with onnxruntime segments (Mul is excluded
from clustering, so every Mul becomes a fallback segment), then times:
- the whole plan, with onnxruntime sub-sessions spinning (onnxruntime's default) and not
  (ours); spinning pools left behind by one segment keep both cores busy while the next
  step runs;
- the run loop alone, with every step stubbed out, per step.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from autoclust.backends import ort as ort_backend
from onnx import TensorProto, helper

import autoclust


def alternating_model(steps: int) -> object:
    """x -> (Relu, Tanh, Sigmoid, Neg) -> Mul(0.5) -> ... `steps` times."""
    nodes, prev = [], "x"
    inits = [helper.make_tensor("half", TensorProto.FLOAT, [], [0.5])]
    for s in range(steps):
        for op in ("Relu", "Tanh", "Sigmoid", "Neg"):
            out = f"{op}_{s}"
            nodes.append(helper.make_node(op, [prev], [out]))
            prev = out
        out = "y" if s == steps - 1 else f"mul_{s}"
        nodes.append(helper.make_node("Mul", [prev, "half"], [out]))
        prev = out
    graph = helper.make_graph(
        nodes, "alternating", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _median_us(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def measure(steps: int, n: int, repeat: int) -> dict[str, float]:
    """Times (us) of the plan with spinning sub-sessions, without, and the bare run loop."""
    model = alternating_model(steps)
    feeds = {"x": np.random.default_rng(0).standard_normal(n).astype(np.float32)}
    out: dict[str, float] = {}
    original = ort_backend.sub_session_options
    for spinning in (True, False):
        def options(user, threads=0, spinning_=spinning):
            return original(user, threads, spinning=spinning_)
        ort_backend.sub_session_options = options
        try:
            sess = autoclust.InferenceSession(model, cluster_exclude_ops="Mul")
        finally:
            ort_backend.sub_session_options = original
        out["spinning" if spinning else "no_spinning"] = _median_us(
            lambda s=sess: s.run(None, feeds), repeat)
    rt = sess._runtime
    out["steps"] = len(rt.steps)
    stub = [np.zeros(1, np.float32)]
    rt.steps = [(lambda inputs, o=outs: stub * len(o), ins, outs, frees)
                for _, ins, outs, frees in rt.steps]
    out["loop_per_step"] = _median_us(lambda: rt.run(feeds), repeat) / out["steps"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autoclust.tools.bench.plan")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--n", type=int, default=65536)
    p.add_argument("--repeat", type=int, default=200)
    args = p.parse_args(argv)
    r = measure(args.steps, args.n, args.repeat)
    print(f"{int(r['steps'])} plan steps on {args.n} floats: onnxruntime sub-sessions "
          f"spinning {r['spinning']:.0f} us, not spinning {r['no_spinning']:.0f} us per run; "
          f"run loop alone {r['loop_per_step']:.2f} us per step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
