"""`python` with the GPU stand-in installed, for the first-light script's subprocesses on
a host without a GPU: `python standin_python.py -m MODULE ARGS...` or `-c CODE`."""

from __future__ import annotations

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest

from support import fake_cupy


def main(argv: list[str]) -> None:
    """Install the stand-in, then run argv as `python` would."""
    patch = pytest.MonkeyPatch()
    installed = fake_cupy.installed(patch)
    next(installed)
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102
    elif argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        raise SystemExit(f"standin_python: -m MODULE or -c CODE, not {argv[:1]}")


if __name__ == "__main__":
    main(sys.argv[1:])
