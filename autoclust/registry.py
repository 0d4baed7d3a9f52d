"""Backends by name: the core reaches concrete backends only through this table.

A backend is a module with `NAME`, `why_not(node, graph) -> str | None` (None: it can
compile the node) and `compile(graph, flags) -> Executable`, where Executable has
`run(inputs) -> outputs`, `num_kernels` and `dumps` ({file suffix: text}).
Third-party backends register through the `autoclust.backends` entry-point group.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from types import ModuleType

from autoclust.errors import FlagError

BACKENDS = {
    "cpu": "autoclust.backends.cpu",
    "gpu": "autoclust.backends.gpu",
    "interpreter": "autoclust.interpreter",
}

_loaded: dict[str, ModuleType] = {}


def _entry_points() -> dict[str, str]:
    try:
        eps = metadata.entry_points(group="autoclust.backends")
    except Exception:  # noqa: BLE001 - broken metadata must not break the built-in backends
        return {}
    return {ep.name: ep.value for ep in eps}


def get_backend(name: str) -> ModuleType:
    """The backend module called `name`; FlagError when unknown or unavailable."""
    mod = _loaded.get(name)
    if mod is not None:
        return mod
    path = BACKENDS.get(name) or _entry_points().get(name)
    if path is None:
        known = ", ".join(sorted(BACKENDS))
        raise FlagError(f"unknown device {name!r}; known devices: {known}")
    try:
        mod = importlib.import_module(path)
    except ImportError as exc:
        raise FlagError(f"device {name!r} is not available here: {exc}") from None
    if not hasattr(mod, "compile") or not hasattr(mod, "why_not"):
        raise FlagError(f"device {name!r} ({path}) is not usable on this machine yet")
    _loaded[name] = mod
    return mod
