"""autoclust's version (a leaf module: cache keys and dumps read it without importing the package API)."""

__version__ = "0.1.0"
