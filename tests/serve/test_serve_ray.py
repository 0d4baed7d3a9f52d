"""`autoclust serve` on a local Ray instance with 2 CPUs: a zoo model on 2 replicas, driven by
tritonclient (JSON and binary) with every answer compared with onnxruntime; a replica killed
under load is replaced and no request gets a wrong answer; metrics in Prometheus format;
Ctrl-C stops what the command started and nothing else; batch inference on Ray Data.

One test function: its steps share one Ray instance (starting one is ~10 s), and pytest-xdist
would split separate tests of a module across workers, each starting its own.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import onnxruntime as ort
import pytest

SKIP = 'Ray Serve, Ray Data or tritonclient not installed (pip install "autoclust[serve]")'
ray = pytest.importorskip("ray", reason=SKIP)
serve = pytest.importorskip("ray.serve", reason=SKIP)
pytest.importorskip("ray.data", reason=SKIP)
http = pytest.importorskip("tritonclient.http", reason=SKIP)
from support import paths
from tritonclient.utils import InferenceServerException

from autoclust.runtime import disk_cache

REPO = paths.REPO
MODEL = os.path.join(REPO, "models", "mlp_gelu.onnx")  # x f32[batch, 64] -> logits [batch, 16]
APP = "autoclust-mlp_gelu"
REF = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def close(got, x):
    want = REF.run(None, {"x": x})[0]
    return got.shape == want.shape and float(np.abs(got - want).max()) < 1e-5


def start_cli(tmp_path, port, cache):
    log = open(tmp_path / "cli.log", "w")  # noqa: SIM115 - the process writes it
    cmd = [sys.executable, "-m", "autoclust.tools.cli", "serve", MODEL, "--replicas", "2",
           "--replica_cpus", "0.5", "--port", str(port), "--cache_dir", str(cache),
           "--max_batch_size", "4", "--address", ray.get_runtime_context().gcs_address]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        text = (tmp_path / "cli.log").read_text()
        if "Ctrl-C stops it" in text:
            return proc
        assert proc.poll() is None, text[-4000:]
        time.sleep(0.2)
    proc.kill()
    pytest.fail("autoclust serve did not come up:\n" + text[-4000:])


def infer(client, x, binary=True):
    inp = http.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = http.InferRequestedOutput("logits", binary_data=binary)
    return client.infer("mlp_gelu", [inp], outputs=[out]).as_numpy("logits")


def check_answers(url):
    client = http.InferenceServerClient(url)
    assert client.is_server_live() and client.is_model_ready("mlp_gelu")
    meta = client.get_model_metadata("mlp_gelu")
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}]
    rng = np.random.default_rng(0)
    for rows in (1, 3, 8, 3, 1):
        for binary in (True, False):
            x = rng.standard_normal((rows, 64)).astype(np.float32)
            assert close(infer(client, x, binary), x)
    with pytest.raises(InferenceServerException) as bad:
        infer(client, np.zeros((2, 32), np.float32))
    assert bad.value.status() == "400"
    assert "input 'x': dim 1 is 32, expected 64" in bad.value.message()
    x = np.ones((2, 64), np.float32)
    assert close(infer(client, x), x)  # and serves on


def replicas():
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["name"].startswith(f"SERVE_REPLICA::{APP}#"))


def check_replica_killed_under_load(url):
    before = replicas()
    assert len(before) == 2
    outcomes, stop = [], threading.Event()

    def caller(seed):
        client, rng = http.InferenceServerClient(url), np.random.default_rng(seed)
        while not stop.is_set():
            x = rng.standard_normal((int(rng.integers(1, 4)), 64)).astype(np.float32)
            try:
                outcomes.append(("ok", close(infer(client, x), x)))
            except InferenceServerException as exc:  # an error status, never a wrong tensor
                outcomes.append(("error", exc.status()))

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(outcomes) >= 40, 60, "requests before the kill")
        ray.kill(ray.get_actor(before[0], namespace="serve"), no_restart=True)
        wait_for(lambda: len(replicas()) == 2 and before[0] not in replicas(), 120,
                 "a replacement replica")
        served = len(outcomes)
        wait_for(lambda: len(outcomes) >= served + 40, 60, "requests after the replacement")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert all(good for kind, good in outcomes if kind == "ok"), "a wrong answer"
    assert sum(kind == "ok" for kind, _ in outcomes) >= 80
    assert all(status and status.startswith("5") for kind, status in outcomes if kind == "error")


def wait_for(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(0.2)


def metric(text, name, **tags):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in tags.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def check_metrics(metrics_port, cache):
    def scrape():
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        return urllib.request.urlopen(url, timeout=10).read().decode()

    wait_for(lambda: "ray_autoclust_cache_entries_total" in scrape(), 60, "Ray's metrics")
    text = scrape()
    assert metric(text, "ray_autoclust_requests_total", model="mlp_gelu", status="200") >= 80
    assert metric(text, "ray_autoclust_request_latency_ms_count", model="mlp_gelu") >= 80
    assert metric(text, "ray_autoclust_compiles_total", model="mlp_gelu") >= 1
    files = [p for p in cache.iterdir() if p.suffix in (".o", ".prog")]
    stored = metric(text, "ray_autoclust_cache_entries_total", event="stored")
    # a replica met a signature another had compiled and loaded it; no entry was built
    # twice (a killed replica's counts may be lost: that only lowers the sum)
    assert metric(text, "ray_autoclust_cache_entries_total", event="loaded") >= 1
    assert 1 <= stored <= len(files)
    # the replicas authenticated their entries with a key from the Ray cluster's token
    assert all(p.read_bytes().startswith(disk_cache.MAC_MAGIC) for p in files)


def check_explain(url):
    with urllib.request.urlopen(f"http://{url}/v2/models/mlp_gelu/explain", timeout=30) as r:
        text = r.read().decode()
    assert "Built 1 cluster covering 12/12 nodes" in text
    assert re.search(r"replica pid \d+: \d+ requests", text)


def stop_cli(proc, tmp_path):
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0, (tmp_path / "cli.log").read_text()[-4000:]
    assert APP not in serve.status().applications
    with pytest.raises(ValueError):  # it started Serve, so it stopped Serve
        ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
    assert ray.get(ray.put(7)) == 7 and ray.is_initialized()  # the cluster it joined lives


def check_ray_data(cache):
    import autoclust.ray as acr
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((40, 64)).astype(np.float32)
    ds = ray.data.from_items([{"x": xs[i], "id": i} for i in range(len(xs))])
    rows = ds.map_batches(acr.Predictor(MODEL, cache_dir=str(cache)), batch_size=16,
                          concurrency=2, num_cpus=0.5).take_all()
    assert sorted(r["id"] for r in rows) == list(range(len(xs)))
    got = np.stack([r["logits"] for r in sorted(rows, key=lambda r: r["id"])])
    assert close(got, xs)


def test_fleet_on_ray(tmp_path):
    metrics_port, port = free_port(), free_port()
    cache = tmp_path / "cache"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _metrics_export_port=metrics_port)
    try:
        cli = start_cli(tmp_path, port, cache)
        try:
            url = f"127.0.0.1:{port}"
            check_answers(url)
            check_replica_killed_under_load(url)
            check_explain(url)
            check_metrics(metrics_port, cache)
        finally:
            if cli.poll() is None:
                stop_cli(cli, tmp_path)
        check_ray_data(cache)
    finally:
        ray.shutdown()
