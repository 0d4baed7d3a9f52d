"""One model behind the KServe v2 protocol: routes, checks, runs, answers. Plain Python.

    GET  /v2/health/live, /v2/health/ready        200
    GET  /v2                                      server metadata
    GET  /v2/models/{name}[/versions/1]           inputs and outputs (symbolic dims as -1)
    GET  /v2/models/{name}/ready                  200
    GET  /v2/models/{name}/explain                what clustered and why (text), this
                                                  replica's requests and compiles
    POST /v2/models/{name}/infer                  inference (protocol.py)

The Ray Serve deployment (`deployment.py`) calls the same steps (route, parse, run, encode)
around its own body reading, batching and timeouts; tests call `handle`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, NamedTuple

import numpy as np
from autoclust.serve import batching, protocol
from autoclust.serve.metrics import Metrics
from autoclust.serve.protocol import InferRequest, Limits, ProtocolError

import autoclust
from autoclust import errors
from autoclust import flags as flags_mod
from autoclust.version import __version__


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """What every replica of one served model is built from."""

    model: str  # path to the .onnx file (readable from every node of the cluster)
    name: str = ""  # the model's name in URLs; "" means the file's stem
    flags: str = ""  # AUTOCLUST_FLAGS syntax
    cache_dir: str = ""
    limits: Limits = dataclasses.field(default_factory=Limits)
    max_batch_size: int = 0  # > 1: dynamic batching along the model's batch dim
    batch_wait_ms: float = 2.0
    version: str = "1"

    def model_name(self) -> str:
        return self.name or os.path.splitext(os.path.basename(self.model))[0]

    def session_flags(self) -> dict[str, Any]:
        """Keyword flags for the session (FlagError for a bad --flags string)."""
        overrides = flags_mod.parse_string(self.flags)
        if self.cache_dir:
            overrides["cache_dir"] = self.cache_dir
        return overrides


@dataclasses.dataclass(frozen=True)
class Scale:
    """How many replicas, and what each may use."""

    replicas: int = 1
    min_replicas: int = 0  # with max_replicas: autoscaling bounds instead of a fixed count
    max_replicas: int = 0
    replica_cpus: float = 1.0
    max_ongoing_requests: int = 0  # 0: max(8, 2 x max_batch_size)
    env: tuple[tuple[str, str], ...] = ()  # environment of the replicas (the cache key)
    access_log: bool = False  # Serve's line per request in the replicas' logs


class Reply(NamedTuple):
    status: int
    headers: dict[str, str]
    body: bytes


class Endpoint:
    """A session of the model and the v2 protocol around it."""

    def __init__(self, config: ServeConfig, metrics: Metrics | None = None):
        self.config = config
        self.name = config.model_name()
        self.session = autoclust.InferenceSession(config.model, **config.session_flags())
        try:
            self.inputs = [protocol.tensor_spec(a, "input") for a in self.session.get_inputs()]
            self.outputs = [protocol.tensor_spec(a, "output")
                            for a in self.session.get_outputs()]
        except ValueError as exc:
            raise errors.ModelLoadError(f"{config.model}: {exc}") from None
        self.batch_dim = None
        if config.max_batch_size > 1:
            try:
                self.batch_dim = batching.batch_dim(self.inputs, self.outputs)
            except ValueError as exc:
                raise errors.FlagError(f"{config.model}: {exc}") from None
        self.metrics = metrics or Metrics(self.name)

    # ---- the steps ----------------------------------------------------------------------
    def route(self, method: str, path: str) -> str:
        """The action a request asks for ("infer", "metadata", ...); ProtocolError 404/405."""
        parts = [p for p in path.split("/") if p]
        action = None
        if parts in (["v2", "health", "live"], ["v2", "health", "ready"]):
            action = "health"
        elif parts == ["v2"]:
            action = "server"
        elif parts[:2] == ["v2", "models"] and len(parts) >= 3:
            if parts[2] != self.name:
                raise ProtocolError(404, f"unknown model {parts[2]!r}; this server serves "
                                         f"{self.name!r}")
            rest = parts[3:]
            if rest[:1] == ["versions"] and len(rest) >= 2:
                if rest[1] != self.config.version:
                    raise ProtocolError(404, f"model {self.name!r} has no version "
                                             f"{rest[1]!r}; it has {self.config.version!r}")
                rest = rest[2:]
            action = {(): "metadata", ("ready",): "health", ("explain",): "explain",
                      ("infer",): "infer"}.get(tuple(rest))
        if action is None:
            raise ProtocolError(404, f"no route {path!r}; see /v2/models/{self.name}")
        want = "POST" if action == "infer" else "GET"
        if method != want:
            raise ProtocolError(405, f"{path} takes {want}, got {method}")
        return action

    def parse(self, headers: dict[str, str], body: bytes) -> InferRequest:
        """A checked InferRequest from the body (headers: lower-case names)."""
        limits = self.config.limits
        if len(body) > limits.max_body_bytes:
            raise ProtocolError(413, f"the request body is {len(body)} bytes, over the limit "
                                     f"of {limits.max_body_bytes} (--max_request_mb)")
        body = protocol.decompress(body, headers.get("content-encoding"),
                                   limits.max_body_bytes)
        return protocol.parse_infer(body, headers.get(protocol.HEADER_LENGTH), self.inputs,
                                    self.outputs, limits)

    def run_feeds(self, feeds: dict[str, np.ndarray], names: list[str]
                  ) -> dict[str, np.ndarray]:
        """The session's outputs `names` for `feeds`."""
        return dict(zip(names, self.session.run(names, feeds)))

    def run(self, request: InferRequest) -> dict[str, np.ndarray]:
        return self.run_feeds(request.inputs, list(request.outputs))

    def encode(self, request: InferRequest, results: dict[str, np.ndarray]) -> Reply:
        body, headers = protocol.encode_infer(self.name, self.config.version, request, results)
        return Reply(200, headers, body)

    def answer(self, action: str) -> Reply:
        """The reply to a GET action (everything but infer)."""
        if action == "health":
            return _json(200, {"ready": True})
        if action == "server":
            return _json(200, {"name": "autoclust", "version": __version__,
                               "extensions": ["binary_tensor_data", "explain"]})
        if action == "explain":
            return Reply(200, {"content-type": "text/plain; charset=utf-8"},
                         self.explain().encode())
        return _json(200, protocol.model_metadata(self.name, self.config.version,
                                                  self.inputs, self.outputs))

    def error(self, exc: BaseException) -> Reply:
        """The reply to a failed request: 400 for a bad request or input, 500 otherwise."""
        if isinstance(exc, ProtocolError):
            status, message = exc.status, exc.message
        elif isinstance(exc, errors.InvalidInputError):
            status, message = 400, str(exc)
        else:
            status, message = 500, f"{type(exc).__name__}: {exc}"
        return Reply(status, {"content-type": "application/json"}, protocol.error_body(message))

    def explain(self) -> str:
        """The session's explain text, and what this replica answered and compiled."""
        self.metrics.compiled(self.session)
        head = (f"model {self.name!r} ({self.config.model}), replica pid {os.getpid()}: "
                f"{self.metrics.summary()}")
        lines = [head, "", self.session.explain(), ""]
        for c in self.session.stats()["clusters"]:
            lines.append(f"{c['name']}: {c['compiles']} signatures compiled, {c['runs']} runs"
                         + (f", fell back: {c['fallback']}" if c["fallback"] else ""))
        return "\n".join(lines).rstrip() + "\n"

    # ---- the whole request, synchronously -----------------------------------------------
    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply:
        """Answer one HTTP request; never raises."""
        start = time.perf_counter()
        try:
            action = self.route(method, path)
            if action != "infer":
                return self.answer(action)
            request = self.parse(headers, body)
            reply = self.encode(request, self.run(request))
        except Exception as exc:  # noqa: BLE001 - every failure is an answer, never a crash
            reply = self.error(exc)
        self.record(reply.status, start)
        return reply

    def record(self, status: int, start: float) -> None:
        """Count an answered inference request and any compiles it caused."""
        self.metrics.request(status, time.perf_counter() - start)
        self.metrics.compiled(self.session)


def _json(status: int, obj: Any) -> Reply:
    import json
    return Reply(status, {"content-type": "application/json"}, json.dumps(obj).encode())
