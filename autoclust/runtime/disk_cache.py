"""The --cache_dir entry format: one checksummed file per key (backends' object code).

Also lowered kernel IR Programs (`.prog`, `program_cache.py`), in the same format. Entries are trusted as the object code is: point --cache_dir at a directory only
you can write.

An entry is `MAGIC + sha256(object) + object`. A corrupted or truncated entry is
ignored (and recompiled); an unwritable directory gives one warning and compiling
carries on without the cache.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import warnings

MAGIC = b"ACOBJ1\n"
_warned: set[str] = set()


def make_key(ir_text: str, version: str) -> str:
    """sha256 of the module text and everything else that changes object code."""
    h = hashlib.sha256()
    h.update(version.encode())
    h.update(b"\0")
    h.update(ir_text.encode())
    return h.hexdigest()


def _path(cache_dir: str, key: str, suffix: str = ".o") -> str:
    return os.path.join(cache_dir, f"{key}{suffix}")


def contains(cache_dir: str, key: str, suffix: str = ".o") -> bool:
    """Whether an entry for `key` exists (not checked for corruption)."""
    return os.path.isfile(_path(cache_dir, key, suffix))


def load(cache_dir: str, key: str, suffix: str = ".o") -> bytes | None:
    """The cached bytes for `key` (object code; `.prog`: a lowered Program, see
    program_cache.py), or None (missing or corrupted)."""
    try:
        with open(_path(cache_dir, key, suffix), "rb") as f:
            data = f.read()
    except OSError:
        return None
    head = len(MAGIC) + 32
    if not data.startswith(MAGIC) or len(data) < head:
        return None
    obj = data[head:]
    if hashlib.sha256(obj).digest() != data[len(MAGIC):head]:
        return None
    return obj


def store(cache_dir: str, key: str, obj: bytes, suffix: str = ".o") -> bool:
    """Write an entry atomically; warn once per directory when that fails."""
    try:
        os.makedirs(cache_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + hashlib.sha256(obj).digest() + obj)
        os.replace(tmp, _path(cache_dir, key, suffix))
        return True
    except OSError as exc:
        if cache_dir not in _warned:
            _warned.add(cache_dir)
            warnings.warn(f"autoclust: cannot write the compile cache {cache_dir!r} ({exc}); "
                          "continuing without it", RuntimeWarning, stacklevel=2)
        return False
