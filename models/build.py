"""Write every zoo model as <out>/<name>.onnx: `python -m models.build [--out DIR] [--preset P]`."""

from __future__ import annotations

import argparse
import os
import sys

import onnx

from .zoo import BUILDERS, build

DEFAULT_OUT = os.path.dirname(os.path.abspath(__file__))


def write_all(out_dir: str, names: list[str] | None = None,
              preset: str | None = None) -> list[str]:
    """Build the named models (default: all) into out_dir; returns the written paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name in names or list(BUILDERS):
        path = os.path.join(out_dir, f"{name}.onnx")
        onnx.save_model(build(name, preset=preset), path)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints one line per written file."""
    parser = argparse.ArgumentParser(prog="python -m models.build", description=__doc__)
    parser.add_argument("--out", default=DEFAULT_OUT, help="output folder (default: models/)")
    parser.add_argument("--preset", default=None, help="size preset, e.g. bench")
    parser.add_argument("names", nargs="*", help=f"models to write (default: all of "
                                                 f"{', '.join(BUILDERS)})")
    args = parser.parse_args(argv)
    for path in write_all(args.out, args.names or None, args.preset):
        print(f"{path}  {os.path.getsize(path)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
