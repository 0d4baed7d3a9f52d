"""The `autoclust` command: run, explain, replay, flags, exec, zoo, bench, fuzz.

User mistakes (missing files, bad flags, bad inputs) print one line and exit 2; a replay
mismatch exits 1. Tracebacks are for our bugs only.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import autoclust
from autoclust import registry
from autoclust.errors import AutoclustError


def _cmd_flags(args: argparse.Namespace) -> int:
    from autoclust import flags
    print(flags.table())
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from autoclust.tools import run
    return run.main(args)


def _cmd_explain(args: argparse.Namespace) -> int:
    from autoclust.tools import run
    return run.explain_main(args)


def _cmd_replay(args: argparse.Namespace) -> int:
    from autoclust.tools import replay
    return replay.main(args)


def _cmd_exec(args: argparse.Namespace) -> int:
    from autoclust.tools import run
    return run.exec_main(args)


def _cmd_zoo(args: argparse.Namespace) -> int:
    import importlib
    # the module, not autoclust.models.build (the package re-exports zoo.build under that name)
    build = importlib.import_module("autoclust.models.build")
    return build.main(["--out", args.out] if args.out else [])


def _cmd_bench(args: argparse.Namespace) -> int:
    from autoclust.tools import bench
    return bench.main(args.rest)


def _cmd_fuzz(args: argparse.Namespace) -> int:
    from autoclust.tools import fuzz
    return fuzz.main(args.rest)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autoclust", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"autoclust {autoclust.__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a model on given or generated inputs")
    r.add_argument("model")
    r.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    r.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                   help="value for a symbolic dim when inputs are generated")
    r.add_argument("--repeat", type=int, default=10)
    r.add_argument("--compare-ort", action="store_true",
                   help="also run onnxruntime and compare outputs and times")
    r.add_argument("--flags", default=None, help="AUTOCLUST_FLAGS for this run")
    r.add_argument("--seed", type=int, default=0)
    r.set_defaults(fn=_cmd_run)

    e = sub.add_parser("explain", help="which nodes cluster, and why the others do not")
    e.add_argument("model")
    e.add_argument("--json", action="store_true")
    e.add_argument("--flags", default=None)
    e.set_defaults(fn=_cmd_explain)

    rp = sub.add_parser("replay", help="rerun a dumped cluster; compare with onnxruntime")
    rp.add_argument("cluster", help="DIR/cluster_NNNN (or its .onnx)")
    rp.add_argument("--device", default=None, choices=registry.device_names())
    rp.add_argument("--rtol", type=float, default=1e-4)
    rp.add_argument("--atol", type=float, default=1e-5)
    rp.add_argument("--repeat", type=int, default=5)
    rp.add_argument("--flags", default=None)
    rp.set_defaults(fn=_cmd_replay)

    f = sub.add_parser("flags", help="list every flag with its default and meaning")
    f.set_defaults(fn=_cmd_flags)

    x = sub.add_parser("exec", help="run a Python script with auto-jit on")
    x.add_argument("script")
    x.add_argument("args", nargs=argparse.REMAINDER)
    x.set_defaults(fn=_cmd_exec)

    z = sub.add_parser("zoo", help="write the model zoo's .onnx files")
    z.add_argument("--out", default=None)
    z.set_defaults(fn=_cmd_zoo)

    from autoclust.tools import aot  # `autoclust compile`: ahead-of-time kernels
    aot.add_parser(sub)

    for name, fn, help_ in (("bench", _cmd_bench, "benchmark against onnxruntime"),
                            ("fuzz", _cmd_fuzz, "differential graph fuzzer")):
        b = sub.add_parser(name, help=help_, add_help=False)
        b.add_argument("rest", nargs=argparse.REMAINDER)
        b.set_defaults(fn=fn)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `autoclust` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # bench and fuzz own their options (argparse's REMAINDER cannot start with an option).
    if argv and argv[0] in ("bench", "fuzz"):
        args = argparse.Namespace(command=argv[0], rest=argv[1:],
                                  fn=_cmd_bench if argv[0] == "bench" else _cmd_fuzz)
    else:
        args = _parser().parse_args(argv)
    fn: Callable[[argparse.Namespace], int] = args.fn
    try:
        return fn(args)
    except (AutoclustError, FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        print(f"autoclust {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
