"""The Ray Serve deployment: replicas of an Endpoint behind Serve's HTTP proxy.

Each replica owns one session and runs one inference at a time in a worker thread, so its
event loop keeps answering health checks and reading bodies while a run computes;
parallelism comes from replicas (and `--threads` inside each). A request's body is read
against the size limit before it is parsed, a run that outlasts the timeout answers 504, and
an error in one request is that request's answer: nothing a client sends stops a replica.
With `--max_batch_size`, concurrent requests meet in `serve.batch` and run as one batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import time
from typing import Any

from autoclust.serve import batching
from autoclust.serve.endpoint import Endpoint, Reply, Scale, ServeConfig
from autoclust.serve.fleet import install_cache_key
from autoclust.serve.metrics import RayMetrics
from autoclust.serve.protocol import InferRequest, ProtocolError
from ray import serve
from starlette.requests import Request
from starlette.responses import Response


class ModelReplica:
    """One replica: an Endpoint, its metrics in Ray's, its worker thread."""

    def __init__(self, config: ServeConfig):
        install_cache_key()
        self.endpoint = Endpoint(config, RayMetrics(config.model_name()))
        self.limits = config.limits
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="autoclust")
        if config.max_batch_size > 1:
            self.batched.set_max_batch_size(config.max_batch_size)
            self.batched.set_batch_wait_timeout_s(config.batch_wait_ms / 1e3)
            self._run = self._unwrap
        else:
            self._run = self.single

    async def __call__(self, request: Request) -> Response:
        start = time.perf_counter()
        try:
            action = self.endpoint.route(request.method, request.url.path)
            if action != "infer":
                return _response(self.endpoint.answer(action))
            body = await self._read_body(request)
            headers = {k.lower(): v for k, v in request.headers.items()}
            parsed = self.endpoint.parse(headers, body)
            timeout = min(self.limits.timeout_s, parsed.timeout_s or self.limits.timeout_s)
            try:
                results = await asyncio.wait_for(self._run(parsed), timeout)
            except asyncio.TimeoutError:
                raise ProtocolError(504, f"inference took over {timeout:g} s "
                                         "(--timeout_s)") from None
            reply = self.endpoint.encode(parsed, results)
        except Exception as exc:  # noqa: BLE001 - every failure is an answer, never a crash
            reply = self.endpoint.error(exc)
        self.endpoint.record(reply.status, start)
        return _response(reply)

    async def _read_body(self, request: Request) -> bytes:
        limit = self.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ProtocolError(413, f"the request body is {declared} bytes, over the limit "
                                     f"of {limit} (--max_request_mb)")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ProtocolError(413, f"the request body is over the limit of {limit} "
                                         "bytes (--max_request_mb)")
            chunks.append(chunk)
        return b"".join(chunks)

    async def single(self, request: InferRequest) -> dict:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, self.endpoint.run, request)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.002)
    async def batched(self, requests: list[InferRequest]) -> list:
        loop = asyncio.get_running_loop()
        answers = await loop.run_in_executor(self.pool, batching.run_batch,
                                             self.endpoint.run_feeds, requests)
        return [_Failed(a) if isinstance(a, Exception) else a for a in answers]

    async def _unwrap(self, request: InferRequest) -> dict:
        result = await self.batched(request)
        if isinstance(result, _Failed):
            raise result.exc
        return result

    def check_health(self) -> None:
        """Serve's health check: the replica answers while it lives."""


class _Failed:
    """One request's exception carried through serve.batch's list of results."""

    def __init__(self, exc: Exception):
        self.exc = exc


def _response(reply: Reply) -> Response:
    return Response(reply.body, status_code=reply.status, headers=reply.headers)


def application(config: ServeConfig, scale: Scale) -> Any:
    """The bound Serve application of one model."""
    options: dict[str, Any] = {
        "name": "autoclust",
        "ray_actor_options": {"num_cpus": scale.replica_cpus},
        "max_ongoing_requests": scale.max_ongoing_requests or max(8, 2 * config.max_batch_size),
        "health_check_period_s": 5, "graceful_shutdown_timeout_s": 5,
        "logging_config": {"enable_access_log": scale.access_log},
    }
    if scale.env:
        options["ray_actor_options"]["runtime_env"] = {"env_vars": dict(scale.env)}
    if scale.max_replicas:
        options["autoscaling_config"] = {
            "min_replicas": scale.min_replicas, "max_replicas": scale.max_replicas,
            "initial_replicas": max(scale.min_replicas, min(scale.replicas,
                                                             scale.max_replicas))}
    else:
        options["num_replicas"] = scale.replicas
    return serve.deployment(**options)(ModelReplica).bind(config)


def run(config: ServeConfig, scale: Scale, host: str, port: int, address: str | None,
        say: Any = None) -> int:
    """Serve until Ctrl-C (or SIGTERM), then take down what this call started: its
    application always, Serve if it was not running, the local Ray instance if it made
    one; on a cluster it joined, nothing else."""
    import ray
    say = say or (lambda line: print(line, flush=True))
    signal.signal(signal.SIGTERM, _interrupt)
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address=address) if address else ray.init()
    started_serve = not _serve_running()
    app = f"autoclust-{config.model_name()}"
    deployed = False
    try:
        if app in serve.status().applications:
            say(f"autoclust serve: error: an application named {app!r} already runs on this "
                "cluster (pass --name to serve this model under another name)")
            return 2
        serve.start(http_options={"host": host, "port": port,
                                  "request_timeout_s": config.limits.timeout_s + 5})
        deployed = True
        serve.run(application(config, scale), name=app, route_prefix="/", blocking=False)
        say(f"autoclust serve: {config.model_name()!r} on {_replicas(scale)} at "
            f"http://{host}:{port}/v2/models/{config.model_name()}; Ctrl-C stops it")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        _stop(app if deployed else "", started_serve, started_ray)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _serve_running() -> bool:
    import ray
    try:
        ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
        return True
    except ValueError:
        return False


def _replicas(scale: Scale) -> str:
    if scale.max_replicas:
        return f"{scale.min_replicas} to {scale.max_replicas} replicas (autoscaling)"
    return f"{scale.replicas} replica{'s' if scale.replicas != 1 else ''}"


def _stop(app: str, started_serve: bool, started_ray: bool) -> None:
    import ray
    try:
        if started_serve:
            serve.shutdown()  # Serve and every application, ours among them
        elif app and app in serve.status().applications:
            serve.delete(app)
    finally:
        if started_ray:
            ray.shutdown()
