"""Debugging tools: bisect, minify, shrink, repro bundles, replay."""
