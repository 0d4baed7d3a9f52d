"""Shared test helpers: the one place test modules import from (never from each other)."""
