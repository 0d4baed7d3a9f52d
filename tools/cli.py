"""The `autoclust` command: run, explain, replay, flags, exec, zoo, bench, fuzz, bisect, minify,
compile, serve.

User mistakes (missing or unreadable files, bad flags, bad inputs, bad options) print one
line, `autoclust CMD: error: ...`, and exit 2; a replay mismatch exits 1. Output cut short
by a closed pipe (`autoclust explain m.onnx | head`) ends quietly with status 141, as a
program killed by SIGPIPE would. Tracebacks are for our bugs only.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NoReturn

import autoclust
from autoclust import registry
from autoclust.errors import AutoclustError

FLAGS_HELP = ('autoclust flags for this command, as in AUTOCLUST_FLAGS, e.g. '
              '"--device=interpreter --log" (`autoclust flags` lists them)')
SIGPIPE_STATUS = 141  # 128 + SIGPIPE: what a shell reports for a program killed by it


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage block) and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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
    from autoclust.tools.debug import replay
    return replay.main(args)


def _cmd_exec(args: argparse.Namespace) -> int:
    from autoclust.tools import run
    return run.exec_main(args)


def _cmd_zoo(args: argparse.Namespace) -> int:
    import importlib
    # the module, not autoclust.models.build (the package re-exports zoo.build under that name)
    build = importlib.import_module("autoclust.models.build")
    argv = (["--out", args.out] if args.out else []) + (
        ["--preset", args.preset] if args.preset else []) + list(args.names)
    return build.main(argv)


def _cmd_bench(args: argparse.Namespace) -> int:
    from autoclust.tools.bench import command as bench
    return bench.main(args.rest)


def _cmd_fuzz(args: argparse.Namespace) -> int:
    from autoclust.tools.fuzz import command as fuzz
    return fuzz.main(args.rest)


def _cmd_bisect(args: argparse.Namespace) -> int:
    from autoclust.tools.debug import bisect
    return bisect.main(args.rest)


def _cmd_minify(args: argparse.Namespace) -> int:
    from autoclust.tools.debug import minify
    return minify.main(args.rest)


# Commands that parse their own options (argparse's REMAINDER cannot start with an option).
OWN_OPTIONS = {"bench": _cmd_bench, "fuzz": _cmd_fuzz, "bisect": _cmd_bisect,
               "minify": _cmd_minify}


def _add_run(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("run", help="run a model on given or generated inputs, with timings",
                       description="Run MODEL with autoclust on inputs from .npy files or "
                       "generated ones; print shapes, timings and what compiled.")
    r.add_argument("model", help="the .onnx model file")
    r.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="feed input NAME from a .npy file (repeatable); FILE.npz alone feeds "
                        "every array in it by name, e.g. a dump's cluster_NNNN.inputs.npz. "
                        "Inputs not given are generated")
    r.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                   help="size of the model's symbolic dim NAME for generated inputs "
                        "(repeatable), e.g. --dim seq=64")
    r.add_argument("--repeat", type=int, default=100, metavar="N",
                   help="timed runs after the first and 3 untimed ones (default 100); with "
                        "--compare-ort, per side, alternating with onnxruntime in blocks of 10")
    r.add_argument("--compare-ort", action="store_true",
                   help="also run onnxruntime; print the max difference and both times; "
                        "exit 1 when outputs differ by more than 1e-3")
    r.add_argument("--flags", default=None, help=FLAGS_HELP)
    r.add_argument("--seed", type=int, default=0, help="seed of generated inputs (default 0)")
    r.set_defaults(fn=_cmd_run)


def _add_explain(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("explain", help="which nodes cluster, and why the others do not",
                       description="Cluster MODEL as a session would and print the clusters "
                       "and the reason each other node stays in onnxruntime.")
    e.add_argument("model", help="the .onnx model file")
    e.add_argument("--json", action="store_true", help="print JSON instead of text")
    e.add_argument("--html", default=None, metavar="FILE",
                   help="also write the clustered graph as a self-contained HTML page")
    e.add_argument("--flags", default=None, help=FLAGS_HELP)
    e.set_defaults(fn=_cmd_explain)


def _add_replay(sub: argparse._SubParsersAction) -> None:
    rp = sub.add_parser("replay", help="rerun a dumped cluster; compare with onnxruntime",
                        description="Run one cluster of a --dump_to directory compiled, in "
                        "onnxruntime and in the interpreter; exit 1 on a mismatch.")
    rp.add_argument("cluster", help="DIR/cluster_NNNN, its .onnx or its .inputs.npz")
    rp.add_argument("--device", default=None, choices=registry.device_names(),
                    help="device to compile for (default: --device of --flags, else cpu)")
    rp.add_argument("--rtol", type=float, default=1e-4,
                    help="relative tolerance vs onnxruntime (default 1e-4)")
    rp.add_argument("--atol", type=float, default=1e-5,
                    help="absolute tolerance vs onnxruntime (default 1e-5)")
    rp.add_argument("--repeat", type=int, default=5, metavar="N",
                    help="timed runs of each side (default 5)")
    rp.add_argument("--flags", default=None, help=FLAGS_HELP)
    rp.set_defaults(fn=_cmd_replay)


def _add_small(sub: argparse._SubParsersAction) -> None:
    f = sub.add_parser("flags", help="list every flag with its default and meaning",
                       description="List every AUTOCLUST_FLAGS flag: type, default, meaning.")
    f.set_defaults(fn=_cmd_flags)

    x = sub.add_parser("exec", help="run a Python script with auto-jit on",
                       description="Run SCRIPT with autoclust hooked into onnxruntime "
                       "(--auto_jit=2 unless AUTOCLUST_FLAGS sets it).")
    x.add_argument("script", help="the Python script to run")
    x.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    x.set_defaults(fn=_cmd_exec)

    z = sub.add_parser("zoo", help="write the model zoo's .onnx files",
                       description="Build the zoo models from code and write them as .onnx.")
    z.add_argument("names", nargs="*", help="models to write (default: all)")
    z.add_argument("--out", default=None, metavar="DIR",
                   help="folder to write to (default: the installed package's models/)")
    z.add_argument("--preset", default=None,
                   help="size preset, e.g. bench (the benchmark sizes)")
    z.set_defaults(fn=_cmd_zoo)

    from autoclust.tools import aot  # `autoclust compile`: ahead-of-time kernels
    aot.add_parser(sub)
    from autoclust.serve import command as serve  # `autoclust serve`: Ray Serve replicas
    serve.add_parser(sub)

    for name, fn, help_ in (("bench", _cmd_bench, "benchmark against onnxruntime"),
                            ("fuzz", _cmd_fuzz, "differential graph fuzzer"),
                            ("bisect", _cmd_bisect, "find the node that breaks the outputs"),
                            ("minify", _cmd_minify, "shrink a failure to a repro bundle")):
        b = sub.add_parser(name, help=help_, add_help=False)
        b.add_argument("rest", nargs=argparse.REMAINDER, help="its own options")
        b.set_defaults(fn=fn)


def parser() -> argparse.ArgumentParser:
    """The `autoclust` argument parser (bench and fuzz parse their own options)."""
    p = _Parser(prog="autoclust", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"autoclust {autoclust.__version__}",
                   help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           help="`autoclust COMMAND --help` shows its options")
    _add_run(sub)
    _add_explain(sub)
    _add_replay(sub)
    _add_small(sub)
    return p


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc)


def _quiet_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so the exit flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # stdout is no real file (e.g. captured by a test)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `autoclust` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in OWN_OPTIONS:
        args = argparse.Namespace(command=argv[0], rest=argv[1:], fn=OWN_OPTIONS[argv[0]])
    else:
        args = parser().parse_args(argv)
    fn: Callable[[argparse.Namespace], int] = args.fn
    try:
        code = fn(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        _quiet_stdout()
        return SIGPIPE_STATUS
    except (AutoclustError, OSError) as exc:
        print(f"autoclust {args.command}: error: {_message(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
