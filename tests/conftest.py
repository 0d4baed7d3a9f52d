"""Shared pytest set-up: tests/ on sys.path (for op_harness and zoo helpers)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
