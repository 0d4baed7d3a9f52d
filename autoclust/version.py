"""autoclust's version and the digest of its sources (a leaf module: cache keys and dumps
read it without importing the package API)."""

from __future__ import annotations

__version__ = "0.1.0"

_SOURCES: dict[str, str] = {}


def source_digest() -> str:
    """sha1 of autoclust's Python sources (~1 MB, read once per process). Cache keys carry
    it: a Program lowered (runtime/program_cache.py) or object code compiled
    (backends/cpu/jit.py) by one version of the code is never read by another, even where
    the version string did not change (a source checkout, a fix between releases)."""
    if not _SOURCES:
        import hashlib
        import importlib.util
        import pathlib
        h = hashlib.sha1()
        root = pathlib.Path(__file__).parent
        # a source checkout maps autoclust.backends, .importers... to folders beside
        # autoclust/ (pyproject's package-dir); installed, they are inside it
        trees = [("", root)]
        for sub in ("backends", "importers", "serve", "tools"):
            spec = importlib.util.find_spec(f"autoclust.{sub}")
            for where in (spec.submodule_search_locations or []) if spec else []:
                path = pathlib.Path(where)
                if root not in path.parents:
                    trees.append((sub, path))
        for prefix, tree in trees:
            for path in sorted(tree.rglob("*.py")):
                name = pathlib.Path(prefix, path.relative_to(tree))
                h.update(str(name).encode() + b"\0" + path.read_bytes())
        _SOURCES["digest"] = h.hexdigest()
    return _SOURCES["digest"]
