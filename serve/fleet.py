"""What every replica and Ray Data actor of a fleet shares: the key of the compile cache.

Replicas share compiled code through `--cache_dir` on shared storage (see
`autoclust/runtime/disk_cache.py`: atomic writes, a build lock, a trust check, HMAC entries),
not through Ray's object store: the directory survives restarts and replica deaths, serves
processes that are not Ray workers too, and needs no coordinating actor.

Entries shared between machines are authenticated with a key every member derives the same
way: `AUTOCLUST_CACHE_KEY` when set (`autoclust serve` passes the launching shell's value to
its replicas), else the Ray cluster's own secret, its authentication token (Ray's token
authentication, on by default for clusters started by Ray >= 2.52): whoever holds it can
already run code on the cluster. Without either, entries are only checksummed, and the
trust check on the directory is all that stands between its writers and the replicas.
"""

from __future__ import annotations

import os

from autoclust.runtime import disk_cache


def install_cache_key() -> str:
    """Authenticate --cache_dir entries in this process; where the key came from:
    "AUTOCLUST_CACHE_KEY", "the Ray cluster's token", or "" (no key)."""
    if os.environ.get(disk_cache.KEY_ENV):
        return disk_cache.KEY_ENV  # disk_cache reads it itself
    token = ray_token()
    if token:
        disk_cache.set_key("ray auth token\0" + token)
        return "the Ray cluster's token"
    return ""


def ray_token() -> str:
    """The Ray cluster's authentication token when token authentication is on, else ""."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return ""
    try:  # Ray's own loader: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token
        from ray._raylet import AuthenticationTokenLoader
        return AuthenticationTokenLoader.instance().get_raw_token(ignore_auth_mode=True) or ""
    except (ImportError, AttributeError, TypeError):  # Ray without token authentication
        pass
    token = os.environ.get("RAY_AUTH_TOKEN", "")
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    if not token and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    return token
