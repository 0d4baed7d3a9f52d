"""The model zoo: deterministic ONNX builders in the shapes real exporters emit (see zoo.py)."""

from .zoo import BUILDERS, PRESETS, build, default_dims, feeds, zoo_name

__all__ = ["BUILDERS", "PRESETS", "build", "default_dims", "feeds", "zoo_name"]
