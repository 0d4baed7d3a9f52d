"""Dump texts made when first read: an executable's `dumps` ({file suffix: text})."""

from __future__ import annotations

import collections.abc
from collections.abc import Iterator, Mapping
from typing import Any


class LazyDumps(collections.abc.MutableMapping):
    """An executable's dump texts by suffix; a value set as a zero-argument callable is
    made when first read. Only --dump_to and tests read them, and printing BERT's graphs
    and kernel IR took 30-50 ms of each compile (most of a warm --cache_dir compile)."""

    def __init__(self, texts: Mapping[str, Any] | None = None):
        self._texts: dict[str, Any] = dict(texts or {})

    def __getitem__(self, key: str) -> str:
        value = self._texts[key]
        if callable(value):
            value = self._texts[key] = value()
        return value

    def __setitem__(self, key: str, value: Any) -> None:
        self._texts[key] = value

    def __delitem__(self, key: str) -> None:
        del self._texts[key]

    def __contains__(self, key: object) -> bool:
        return key in self._texts  # Mapping's own would make the text

    def __iter__(self) -> Iterator[str]:
        return iter(self._texts)

    def __len__(self) -> int:
        return len(self._texts)

    def __repr__(self) -> str:
        return f"LazyDumps({sorted(self._texts)})"


def lazy_dumps(exe: Any) -> LazyDumps:
    """exe.dumps as a LazyDumps (made one if it is a plain dict)."""
    if not isinstance(exe.dumps, LazyDumps):
        exe.dumps = LazyDumps(exe.dumps)
    return exe.dumps
