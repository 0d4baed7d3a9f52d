"""The --cache_dir entry format, shared by every process that points at the directory.

Entries are backends' object code (`.o`, `.cubin`) and lowered kernel IR Programs (`.prog`,
pickled; `program_cache.py`). **The cache is code**: whoever can write an entry runs code in
every process that loads it, and a checksum does not stop that. So:

- trust: a directory that other users can write (or that sits in one they can rename it
  out of) is refused, as ssh refuses a loose key file, with one warning; compiling carries on
  without the cache. `--cache_trusted` says everyone who can write it is trusted.
- authentication: with a key (`AUTOCLUST_CACHE_KEY` in the environment, or one the serving
  layer derives from the Ray cluster's token through `set_key`), an entry is
  `MAC_MAGIC + key id + HMAC-SHA256(key, name + object) + object`; an entry whose MAC does not
  verify is refused, reported (a warning naming the file) and rebuilt. Without a key an entry
  is `MAGIC + sha256(object) + object`, which catches corruption only.
- one build for many processes: `locked(dir, key)` is an exclusive flock; the first process
  to miss an entry builds it while the others wait, then load it. Writes are atomic
  (a temporary file renamed over the entry), so a reader never sees half an entry.

A corrupted or truncated entry is ignored and rebuilt; an unwritable directory gives one
warning and compiling carries on without the cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import stat
import tempfile
import time
import warnings
from collections.abc import Iterator
from types import ModuleType

MAGIC = b"ACOBJ1\n"  # + sha256(object) + object: integrity only
MAC_MAGIC = b"ACMAC1\n"  # + key id (8 bytes) + HMAC-SHA256 + object: authenticated
KEY_ENV = "AUTOCLUST_CACHE_KEY"
LOCK_TIMEOUT_S = 600.0  # a build that holds a lock longer is presumed stuck: build anyway
# loaded / stored entries, entries refused (failed authentication, unauthenticated under a
# key), lock waits (another process was building the entry); tests and metrics read them
COUNTS = {"loaded": 0, "stored": 0, "refused": 0, "lock_waits": 0}
_warned: set[str] = set()
_verdicts: dict[str, str | None] = {}  # cache_dir -> why it is refused (None: usable)
_trusted_roots: set[str] = set()  # real paths of --cache_trusted directories
_refused: set[tuple[str, int]] = set()  # (path, mtime) of entries refused, counted once
_key: dict[str, bytes | None] = {}  # "mac": the MAC key once resolved


def make_key(ir_text: str, version: str) -> str:
    """sha256 of the module text and everything else that changes object code."""
    h = hashlib.sha256()
    h.update(version.encode())
    h.update(b"\0")
    h.update(ir_text.encode())
    return h.hexdigest()


def set_key(secret: str | bytes | None) -> None:
    """Authenticate entries with a key derived from `secret` (None: no key) in this
    process, instead of AUTOCLUST_CACHE_KEY."""
    _key["mac"] = _derive(secret)


def _derive(secret: str | bytes | None) -> bytes | None:
    if not secret:
        return None
    raw = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(b"autoclust --cache_dir entries", raw, hashlib.sha256).digest()


def _mac_key() -> bytes | None:
    if "mac" not in _key:
        _key["mac"] = _derive(os.environ.get(KEY_ENV))
    return _key["mac"]


def _key_id(mac_key: bytes) -> bytes:
    return hashlib.sha256(b"key id\0" + mac_key).digest()[:8]


def _path(cache_dir: str, key: str, suffix: str = ".o") -> str:
    return os.path.join(cache_dir, f"{key}{suffix}")


def trust(cache_dir: str, trusted: bool = False) -> bool:
    """Whether this process may use `cache_dir` (checked once per directory; `trusted`:
    --cache_trusted, which covers the folders inside it too). A refused directory gets one
    warning saying why and what to do."""
    real = os.path.realpath(cache_dir)
    if trusted:
        _trusted_roots.add(real)
    if any(real == root or real.startswith(root + os.sep) for root in _trusted_roots):
        return True
    if cache_dir not in _verdicts:
        reason = _verdicts[cache_dir] = why_untrusted(cache_dir)
        if reason:
            warnings.warn(f"autoclust: refusing --cache_dir {cache_dir!r}: {reason}. Its "
                          "entries are code that every process using it runs; make it "
                          "private (chmod go-w), or pass --cache_trusted if everyone who can "
                          "write it is trusted. Continuing without the cache",
                          RuntimeWarning, stacklevel=3)
    return _verdicts[cache_dir] is None


def why_untrusted(cache_dir: str) -> str | None:
    """Why other users could write entries into `cache_dir` (None: they cannot), as ssh
    checks a key file: the directory must be yours (or root's) and not writable by group or
    others; every directory above it must be too, unless it is sticky (/tmp)."""
    if not hasattr(os, "getuid"):
        return None  # no POSIX owners and modes (Windows): nothing to check
    path = os.path.realpath(cache_dir)
    while not os.path.exists(path):  # created later with our umask: check what exists
        path = os.path.dirname(path)
    me = os.getuid()
    leaf = True
    while True:
        st = os.stat(path)
        if st.st_uid not in (me, 0):
            return f"{path} belongs to uid {st.st_uid}, not to you (uid {me})"
        loose = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if loose and (leaf or not st.st_mode & stat.S_ISVTX):
            return f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path, leaf = parent, False


def usable(cache_dir: str) -> bool:
    """A non-empty cache_dir this process trusts (see `trust`)."""
    return bool(cache_dir) and trust(cache_dir)


def contains(cache_dir: str, key: str, suffix: str = ".o") -> bool:
    """Whether an entry for `key` exists (not checked for corruption)."""
    return usable(cache_dir) and os.path.isfile(_path(cache_dir, key, suffix))


def load(cache_dir: str, key: str, suffix: str = ".o") -> bytes | None:
    """The cached bytes for `key` (object code; `.prog`: a lowered Program, see
    program_cache.py), or None: missing, corrupted, or refused (see the module doc)."""
    if not usable(cache_dir):
        return None
    path = _path(cache_dir, key, suffix)
    try:
        with open(path, "rb") as f:
            data = f.read()
            version = os.fstat(f.fileno()).st_mtime_ns
    except OSError:
        return None
    obj = _open_entry(data, (path, version), f"{key}{suffix}")
    if obj is not None:
        COUNTS["loaded"] += 1
    return obj


def _open_entry(data: bytes, entry: tuple[str, int], name: str) -> bytes | None:
    mac_key = _mac_key()
    if mac_key is None:
        head = len(MAGIC) + 32
        if not data.startswith(MAGIC) or len(data) < head:
            return None  # corrupted, or written under a key this process does not have
        obj = data[head:]
        return obj if hashlib.sha256(obj).digest() == data[len(MAGIC):head] else None
    head = len(MAC_MAGIC) + 8 + 32
    if not data.startswith(MAC_MAGIC):
        _refuse(entry, "it is not authenticated (written without a key)", once=True)
        return None
    if data[len(MAC_MAGIC):len(MAC_MAGIC) + 8] != _key_id(mac_key):
        return None  # written under another key: rebuilt and rewritten under ours
    obj = data[head:]
    want = hmac.new(mac_key, name.encode() + b"\0" + obj, hashlib.sha256).digest()
    if len(data) < head or not hmac.compare_digest(want, data[head - 32:head]):
        _refuse(entry, "its authentication code does not verify: it was changed after it "
                      "was written (tampered with, or corrupted)")
        return None
    return obj


def _refuse(entry: tuple[str, int], why: str, once: bool = False) -> None:
    """Count and report a refused entry (path, mtime), once however often it is read."""
    if entry in _refused:
        return
    _refused.add(entry)
    COUNTS["refused"] += 1
    path = entry[0]
    tag = os.path.dirname(path) if once else path
    if once and tag in _warned:
        return
    _warned.add(tag)
    warnings.warn(f"autoclust: refused the compile cache entry {path}: {why}; "
                  "it is rebuilt" + (" (said once per directory)" if once else ""),
                  RuntimeWarning, stacklevel=4)


def store(cache_dir: str, key: str, obj: bytes, suffix: str = ".o") -> bool:
    """Write an entry atomically; warn once per directory when that fails."""
    if not usable(cache_dir):
        return False
    mac_key = _mac_key()
    if mac_key is None:
        head = MAGIC + hashlib.sha256(obj).digest()
    else:
        mac = hmac.new(mac_key, f"{key}{suffix}".encode() + b"\0" + obj, hashlib.sha256)
        head = MAC_MAGIC + _key_id(mac_key) + mac.digest()
    try:
        _makedirs(cache_dir)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(head + obj)
        os.replace(tmp, _path(cache_dir, key, suffix))
        COUNTS["stored"] += 1
        return True
    except OSError as exc:
        if cache_dir not in _warned:
            _warned.add(cache_dir)
            warnings.warn(f"autoclust: cannot write the compile cache {cache_dir!r} ({exc}); "
                          "continuing without it", RuntimeWarning, stacklevel=2)
        return False


def _makedirs(cache_dir: str) -> None:
    if not os.path.isdir(cache_dir):
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)  # private: see `trust`


@contextlib.contextmanager
def locked(cache_dir: str, key: str) -> Iterator[None]:
    """Hold the build lock of `key` in `cache_dir` (an flock, released if the holder dies):
    the first process to miss an entry builds it, the others wait here and then load it.
    A no-op without a usable directory or where flock does not exist."""
    fcntl: ModuleType | None
    try:
        import fcntl
    except ImportError:  # Windows: processes may build the same entry twice (harmless)
        fcntl = None
    fd = -1
    if fcntl is not None and usable(cache_dir):
        try:
            locks = os.path.join(cache_dir, "locks")
            if not os.path.isdir(locks):
                os.makedirs(locks, mode=0o700, exist_ok=True)
            # 256 lock files, by the key's first byte: a bounded set, rarely contended
            fd = os.open(os.path.join(locks, key[:2] + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
            _acquire(fcntl, fd)
        except OSError:  # an unwritable directory: store() warns; build without the lock
            pass
    try:
        yield
    finally:
        if fd >= 0:
            os.close(fd)  # releases the lock


def _acquire(fcntl: ModuleType, fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        COUNTS["lock_waits"] += 1
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    delay = 0.005
    while time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            continue
    warnings.warn(f"autoclust: a compile cache lock was held for over {LOCK_TIMEOUT_S:.0f} s; "
                  "building without it", RuntimeWarning, stacklevel=4)
