"""`autoclust serve` on a local Ray instance with 2 CPUs: a zoo model on 2 replicas, driven by
tritonclient (JSON and binary) with every answer compared with onnxruntime; the second replica
loads the first one's compile from --cache_dir and builds nothing; metrics in Prometheus
format; SIGTERM stops what the command started and nothing else; batch inference on Ray Data,
its actors reusing the replicas' compile.

Each test function starts one Ray instance (~10 s) and one `autoclust serve` (~20 s) and
runs its steps on them. `test_fleet_on_ray` runs in CI (~60 s on 2 busy cores); the replica
killed under load (another ~60 s) is marked `slow`, which CI leaves out: run it by hand with
`python -m pytest -q -m slow tests/serve/test_serve_ray.py`.
"""

import contextlib
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


# Ray's fixed default ports (GCS, dashboard, client server, dashboard agent): a free port
# handed to Ray as its metrics port that one of its own components then takes fails
# ray.init ("metrics_export is trying to use a port number 52365 that is used by other
# components", seen once)
RAY_DEFAULT_PORTS = frozenset({6379, 8265, 10001, 52365})


def free_port():
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in RAY_DEFAULT_PORTS:
            return port


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
    rng, answers = np.random.default_rng(0), []
    for rows in (1, 3, 8, 3, 1):
        for binary in (True, False):
            x = rng.standard_normal((rows, 64)).astype(np.float32)
            answers.append(close(infer(client, x, binary), x))
    assert all(answers)
    with pytest.raises(InferenceServerException) as bad:
        infer(client, np.zeros((2, 32), np.float32))
    assert bad.value.status() == "400"
    assert "input 'x': dim 1 is 32, expected 64" in bad.value.message()
    x = np.ones((2, 64), np.float32)
    answers.append(close(infer(client, x), x))  # and serves on
    assert all(answers)
    return answers


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


def per_replica(text, name, **tags):
    """{WorkerId: value} of one metric (each replica is one Ray worker)."""
    values = {}
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in tags.items()):
            worker = re.search(r'WorkerId="(\w+)"', line).group(1)
            values[worker] = values.get(worker, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def scrape_metrics(metrics_port, until):
    def scrape():
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        return urllib.request.urlopen(url, timeout=10).read().decode()

    wait_for(lambda: until(scrape()), 60, "Ray's metrics")
    return scrape()


def cache_files(cache):
    """The compiled entries, each with the inode its atomic write gave it."""
    return {p.name: p.stat().st_ino for p in cache.iterdir() if p.suffix in (".o", ".prog")}


def check_second_replica_loads(url, metrics_port, cache, requests):
    """A replica that met a signature another had compiled loaded its entries from
    --cache_dir instead of building them: a replica `loaded` entries, and the fleet stored
    each entry exactly once (every signature is compiled once, by one replica)."""
    client, x = http.InferenceServerClient(url), np.ones((1, 64), np.float32)

    def settled(text):
        if not per_replica(text, "ray_autoclust_cache_entries_total", event="loaded"):
            # so far Serve routed only first meetings of a shape to the second replica
            requests.append(close(infer(client, x), x))
            return False
        served = metric(text, "ray_autoclust_requests_total", model="mlp_gelu", status="200")
        return served >= len(requests)
    text = scrape_metrics(metrics_port, settled)
    assert all(requests)
    files = cache_files(cache)
    stored = per_replica(text, "ray_autoclust_cache_entries_total", event="stored")
    loaded = per_replica(text, "ray_autoclust_cache_entries_total", event="loaded")
    assert sum(stored.values()) == len(files) >= 2, (stored, files)  # none built twice
    assert 1 <= sum(loaded.values()) <= len(files) and len(stored) + len(loaded) >= 2
    assert metric(text, "ray_autoclust_cache_entries_total", event="refused") == 0
    assert metric(text, "ray_autoclust_compiles_total", model="mlp_gelu") >= 2
    assert metric(text, "ray_autoclust_request_latency_ms_count") >= len(requests)
    # the replicas authenticated their entries with a key from the Ray cluster's token
    assert all((cache / name).read_bytes().startswith(disk_cache.MAC_MAGIC) for name in files)


def check_explain(url):
    with urllib.request.urlopen(f"http://{url}/v2/models/mlp_gelu/explain", timeout=30) as r:
        text = r.read().decode()
    assert "Built 1 cluster covering 12/12 nodes" in text
    assert re.search(r"replica pid \d+: \d+ requests", text)


def stop_cli(proc, tmp_path, sig):
    proc.send_signal(sig)  # Ctrl-C, or SIGTERM (which Ray's own handler used to abort)
    assert proc.wait(60) == 0, (tmp_path / "cli.log").read_text()[-4000:]
    assert APP not in serve.status().applications
    with pytest.raises(ValueError):  # it started Serve, so it stopped Serve
        ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
    assert ray.get(ray.put(7)) == 7 and ray.is_initialized()  # the cluster it joined lives


def check_ray_data(cache):
    """Predictor actors (with the replicas' --threads, so the same code keys) load the
    replicas' entries: they may add entries for batch shapes the replicas never met, but
    rewrite none (a rebuilt entry's atomic write would give it a new inode)."""
    import autoclust.ray as acr
    before = cache_files(cache)
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((40, 64)).astype(np.float32)
    ds = ray.data.from_items([{"x": xs[i], "id": i} for i in range(len(xs))])
    predictor = acr.Predictor(MODEL, cache_dir=str(cache), flags="--threads=1")
    rows = ds.map_batches(predictor, batch_size=16, concurrency=2, num_cpus=0.5).take_all()
    assert sorted(r["id"] for r in rows) == list(range(len(xs)))
    got = np.stack([r["logits"] for r in sorted(rows, key=lambda r: r["id"])])
    assert close(got, xs)
    assert cache_files(cache).items() >= before.items()


@contextlib.contextmanager
def local_ray():
    """A local Ray instance with 2 CPUs; yields the port its metrics are exported on."""
    metrics_port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _metrics_export_port=metrics_port)
    try:
        yield metrics_port
    finally:
        ray.shutdown()


@contextlib.contextmanager
def serving(tmp_path, cache, stop_signal):
    """`autoclust serve` on the Ray instance; yields its address; stops it with
    `stop_signal`."""
    port = free_port()
    cli = start_cli(tmp_path, port, cache)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        if cli.poll() is None:
            stop_cli(cli, tmp_path, stop_signal)


def test_fleet_on_ray(tmp_path):
    cache = tmp_path / "cache"
    with local_ray() as metrics_port:
        with serving(tmp_path, cache, signal.SIGTERM) as url:
            requests = check_answers(url)
            check_second_replica_loads(url, metrics_port, cache, requests)
            check_explain(url)
        check_ray_data(cache)  # on the cluster the command joined and left running


@pytest.mark.slow
def test_replica_killed_under_load_is_replaced(tmp_path):
    cache = tmp_path / "cache"
    with local_ray() as metrics_port, serving(tmp_path, cache, signal.SIGINT) as url:
        check_replica_killed_under_load(url)
        # a killed replica's counts may be lost: the sum is a lower bound, reached once Ray
        # has exported the survivors' latest counts (a first scrape read 30 of them)
        text = scrape_metrics(metrics_port, lambda t: metric(
            t, "ray_autoclust_requests_total", status="200") >= 40)
        assert metric(text, "ray_autoclust_requests_total", status="200") >= 40
        assert 1 <= metric(text, "ray_autoclust_cache_entries_total", event="stored") \
            <= len(cache_files(cache))
