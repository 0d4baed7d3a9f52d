"""`autoclust serve MODEL`: the model over HTTP (KServe v2 / Triton protocol) on Ray Serve.

    autoclust serve model.onnx --replicas 4 [--port 8000] [--address ray://head:10001]
        [--flags "..."] [--cache_dir /shared/ac_cache] [--max_batch_size 16 --batch_wait_ms 2]

Everything a replica would refuse is checked here first, in this process, so a mistake is
one line and exit status 2 rather than replicas failing on the cluster: the model loads and
every input and output is a tensor the protocol carries, the flags parse, a batch dim exists
for --max_batch_size, and --cache_dir is not writable by other users (unless trusted).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from autoclust.errors import FlagError


def add_parser(sub: Any) -> None:
    """Register `autoclust serve` (imports nothing heavy: Ray is imported when it runs)."""
    s = sub.add_parser("serve", help="serve a model over HTTP (KServe v2 / Triton) on Ray Serve",
                       description="Serve MODEL with the KServe v2 / Triton HTTP protocol from "
                       "Ray Serve replicas, each an autoclust session. Starts a local Ray "
                       "instance unless --address joins a cluster; Ctrl-C stops what it "
                       'started. Needs pip install "autoclust[serve]".')
    s.add_argument("model", help="the .onnx model file (readable from every node)")
    s.add_argument("--name", default="", help="the model's name in URLs (default: file stem)")
    s.add_argument("--replicas", type=int, default=1, help="replicas (default 1)")
    s.add_argument("--min_replicas", type=int, default=0,
                   help="with --max_replicas: autoscale between these bounds")
    s.add_argument("--max_replicas", type=int, default=0, help="see --min_replicas")
    s.add_argument("--replica_cpus", type=float, default=1.0,
                   help="CPUs Ray reserves per replica (default 1); also its --threads "
                        "unless --flags sets them")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; 0.0.0.0 for every one)")
    s.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    s.add_argument("--address", default=None,
                   help="join this Ray cluster (ray://head:10001, or auto) instead of "
                        "starting a local Ray instance")
    s.add_argument("--flags", default="", help="autoclust flags for the replicas, as in "
                   "AUTOCLUST_FLAGS")
    s.add_argument("--cache_dir", default="", help="compile cache shared by the replicas "
                   "(shared storage across machines; see docs/serving.md)")
    s.add_argument("--cache_trusted", action="store_true",
                   help="use --cache_dir even though other users can write it")
    s.add_argument("--max_batch_size", type=int, default=0,
                   help="batch up to N concurrent requests along the model's batch dim "
                        "(default 0: off; only for models whose rows are independent)")
    s.add_argument("--batch_wait_ms", type=float, default=2.0,
                   help="how long a batch waits for more requests (default 2)")
    s.add_argument("--max_request_mb", type=float, default=64,
                   help="largest request body, MiB (default 64); larger ones get 413")
    s.add_argument("--max_input_mb", type=float, default=256,
                   help="largest total of a request's input tensors, MiB (default 256)")
    s.add_argument("--max_json_mb", type=float, default=8,
                   help="largest JSON part of a request, MiB (default 8); tensors sent as "
                        "binary data do not count")
    s.add_argument("--timeout_s", type=float, default=60,
                   help="longest inference, queueing included (default 60); then 504")
    s.add_argument("--access_log", action="store_true",
                   help="log a line per request in the replicas' logs")
    s.set_defaults(fn=main)


def main(args: argparse.Namespace) -> int:
    """Check everything here, then serve until Ctrl-C."""
    try:
        from autoclust.serve import deployment
    except ImportError as exc:
        raise FlagError(f'autoclust serve needs Ray Serve ({exc}); pip install '
                        '"autoclust[serve]"') from None
    config, scale = build(args)
    return deployment.run(config, scale, args.host, args.port, args.address)


def build(args: argparse.Namespace) -> tuple[Any, Any]:
    """(ServeConfig, Scale) from the options, checked (FlagError or ModelLoadError)."""
    from autoclust.serve.endpoint import Endpoint, Scale, ServeConfig
    from autoclust.serve.protocol import Limits

    from autoclust import flags as flags_mod
    from autoclust.runtime import disk_cache
    _check_numbers(args)
    given = flags_mod.parse_string(args.flags)
    extra = []
    if "threads" not in given:
        extra.append(f"--threads={max(1, round(args.replica_cpus))}")
    if args.cache_trusted:
        extra.append("--cache_trusted")
    cache_dir = args.cache_dir or given.get("cache_dir", "")
    if cache_dir and not (args.cache_trusted or given.get("cache_trusted")):
        reason = disk_cache.why_untrusted(cache_dir)
        if reason:
            raise FlagError(f"refusing --cache_dir {cache_dir}: {reason}; its entries are "
                            "code every replica runs. Make it private (chmod go-w) or pass "
                            "--cache_trusted if everyone who can write it is trusted")
    limits = Limits(max_body_bytes=int(args.max_request_mb * 2**20),
                    max_input_bytes=int(args.max_input_mb * 2**20), timeout_s=args.timeout_s,
                    max_json_bytes=int(args.max_json_mb * 2**20))
    config = ServeConfig(os.path.abspath(args.model), args.name, " ".join([args.flags, *extra]),
                         args.cache_dir, limits, args.max_batch_size, args.batch_wait_ms)
    Endpoint(config)  # the model, its types and the batch dim, checked before Ray starts
    env = tuple((k, os.environ[k]) for k in (disk_cache.KEY_ENV,) if os.environ.get(k))
    scale = Scale(args.replicas, args.min_replicas, args.max_replicas, args.replica_cpus,
                  env=env, access_log=args.access_log)
    return config, scale


def _check_numbers(args: argparse.Namespace) -> None:
    if args.replicas < 1:
        raise FlagError(f"--replicas must be at least 1, got {args.replicas}")
    if args.max_replicas and not 0 <= args.min_replicas <= args.max_replicas:
        raise FlagError(f"--min_replicas {args.min_replicas} and --max_replicas "
                        f"{args.max_replicas}: need 0 <= min <= max")
    if args.replica_cpus <= 0 or args.timeout_s <= 0 or args.batch_wait_ms < 0:
        raise FlagError("--replica_cpus and --timeout_s must be positive, --batch_wait_ms "
                        "not negative")
    if min(args.max_request_mb, args.max_input_mb, args.max_json_mb) <= 0:
        raise FlagError("--max_request_mb, --max_input_mb and --max_json_mb must be positive")
    if not 0 < args.port < 65536:
        raise FlagError(f"--port must be 1 to 65535, got {args.port}")
