"""The serving load benchmark: a thread pool of tritonclient callers against 1 and 2 replicas,
and the same model in one in-process session, on this machine's cores.

    ac-bench python -m autoclust.serve.bench --model models/bert_encoder.onnx --dim seq=64

Rows (the same total of cores each): `in-process session` (the callers call session.run
directly; --threads = cores), `1 replica` (--threads = cores), `2 replicas` (cores / 2 each),
`2 replicas, batching` (--max_batch_size 8). Each row: requests per second, p50 and p99
latency seen by the callers, errors. The callers run on the same machine, so they take CPU
from the replicas: a ceiling, not a cluster's figure. Answers are checked against
onnxruntime before timing.
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def measure(call: Callable[[], Any], clients: int, seconds: float) -> dict[str, float]:
    """`clients` threads calling `call` back to back for `seconds`: throughput, latency
    percentiles (ms) and the count of calls that raised."""
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def loop() -> None:
        mine, failed = [], 0
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                call()
                mine.append(time.perf_counter() - t0)
            except Exception:  # noqa: BLE001 - counted, the load goes on
                failed += 1
        with lock:
            latencies.extend(mine)
            errors[0] += failed

    threads = [threading.Thread(target=loop) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ms = np.array(latencies) * 1e3 if latencies else np.array([np.nan])
    return {"rps": len(latencies) / wall, "p50": float(np.percentile(ms, 50)),
            "p99": float(np.percentile(ms, 99)), "errors": errors[0]}


def _client_call(url: str, model: str, feeds: dict[str, np.ndarray]) -> Callable[[], Any]:
    from tritonclient import http
    from tritonclient.utils import np_to_triton_dtype
    local = threading.local()

    def call() -> Any:
        if not hasattr(local, "client"):  # one connection per caller thread
            local.client = http.InferenceServerClient(url, network_timeout=120)
        inputs = []
        for name, arr in feeds.items():
            inp = http.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
            inp.set_data_from_numpy(arr)
            inputs.append(inp)
        return local.client.infer(model, inputs)
    return call


def _check(call: Callable[[], Any], want: list[np.ndarray], outputs: list[str]) -> None:
    got = call()
    for name, w in zip(outputs, want):
        err = float(np.abs(got.as_numpy(name).astype(np.float64) - w).max())
        if err > 1e-3:
            raise SystemExit(f"serve bench: output {name} differs from onnxruntime by {err}")


def _served_rows(args: argparse.Namespace, feeds: dict, want: list, outputs: list[str]
                 ) -> list[tuple[str, dict]]:
    import ray
    from autoclust.serve.deployment import application
    from autoclust.serve.endpoint import Scale, ServeConfig
    from ray import serve
    cores = os.cpu_count() or 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    name = os.path.splitext(os.path.basename(args.model))[0]
    rows = []
    try:
        for label, replicas, batch in (("1 replica", 1, 0), ("2 replicas", 2, 0),
                                       ("2 replicas, batching", 2, 8),
                                       ("2 replicas, canned answer (no model)", 2, -1)):
            threads = max(1, cores // replicas)
            config = ServeConfig(os.path.abspath(args.model), flags=f"--threads={threads}",
                                 max_batch_size=max(batch, 0))
            scale = Scale(replicas, replica_cpus=cores / replicas)
            app = application(config, scale) if batch >= 0 else _canned(name, scale, feeds,
                                                                         outputs, want)
            serve.run(app, name="bench", route_prefix="/")
            call = _client_call(f"127.0.0.1:{port}", name, feeds)
            _check(call, want, outputs)
            measure(call, args.clients, args.warmup)  # every replica compiles and warms up
            rows.append((label, measure(call, args.clients, args.seconds)))
            serve.delete("bench")
    finally:
        serve.shutdown()
        ray.shutdown()
    return rows


def _canned(name: str, scale: Any, feeds: dict, outputs: list[str], want: list) -> Any:
    """A deployment answering every request with the right bytes and no work: the cost of
    Serve's proxy, the HTTP and tritonclient alone, the ceiling of the rows above it."""
    from autoclust.serve import protocol
    from ray import serve
    from starlette.responses import Response
    request = protocol.InferRequest(feeds, {n: True for n in outputs})
    results = {n: w.astype(np.float32) for n, w in zip(outputs, want)}
    body, headers = protocol.encode_infer(name, "1", request, results)

    class Canned:
        async def __call__(self, request: Any) -> Any:
            await request.body()
            return Response(body, headers=headers)
    return serve.deployment(name="canned", num_replicas=scale.replicas,
                            ray_actor_options={"num_cpus": scale.replica_cpus})(Canned).bind()


def _in_process_row(args: argparse.Namespace, feeds: dict, want: list, outputs: list[str]
                    ) -> tuple[str, dict]:
    from autoclust.tools.bench import timing
    sess = timing.autoclust_session(args.model, os.cpu_count() or 1)
    got = sess.run(outputs, feeds)
    err = max(float(np.abs(g.astype(np.float64) - w).max()) for g, w in zip(got, want))
    if err > 1e-3:
        raise SystemExit(f"serve bench: the session differs from onnxruntime by {err}")

    def call() -> Any:
        return sess.run(outputs, feeds)
    measure(call, args.clients, args.warmup)
    return "in-process session", measure(call, args.clients, args.seconds)


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table."""
    p = argparse.ArgumentParser(prog="python -m autoclust.serve.bench", description=__doc__)
    p.add_argument("--model", default="models/mlp_gelu.onnx")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                   help="a symbolic dim of the generated inputs (default: batch=1 and the "
                        "zoo's defaults)")
    p.add_argument("--clients", type=int, default=8, help="concurrent callers (default 8)")
    p.add_argument("--seconds", type=float, default=10.0, help="timed load per row")
    p.add_argument("--warmup", type=float, default=3.0, help="untimed load per row first")
    args = p.parse_args(argv)
    import onnxruntime as ort
    from autoclust.tools import run as run_tool
    from autoclust.tools.bench import timing
    model = run_tool.load_model(args.model)
    dims = {"batch": 1, **{k: int(v) for k, v in
                           run_tool.parse_assignments(args.dim, "--dim").items()}}
    feeds = run_tool.generate_inputs(model, dims)
    ref = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
    outputs = [o.name for o in ref.get_outputs()]
    want = [w.astype(np.float64) for w in ref.run(outputs, feeds)]
    rows = [_in_process_row(args, feeds, want, outputs)]
    rows += _served_rows(args, feeds, want, outputs)
    shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in feeds.items())
    print(f"{args.model} ({shapes}), {args.clients} callers, {args.seconds:g} s per row, "
          f"{timing.load_note()}")
    print(timing.table(["", "requests/s", "p50 ms", "p99 ms", "errors"],
                       [(label, f"{r['rps']:.0f}", timing.fmt_ms(r["p50"]),
                         timing.fmt_ms(r["p99"]), r["errors"]) for label, r in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
