"""`autoclust.Builder`: graphs written op by op (`builder.py`; `operand.py` the values and
their operators, op methods in `ops.py`, Loop/If bodies as Python callables in
`control.py`)."""

from autoclust.importers.builder.builder import Builder, Compiled
from autoclust.importers.builder.operand import Operand

__all__ = ["Builder", "Compiled", "Operand"]
