"""The NumPy front end: `autoclust.jit` / `autoclust.trace` trace functions into graphs.

`trace.py` holds the Tracer (a stand-in array whose NumPy protocols build graph nodes) and
`trace_graph`; the lowerings live beside it, by kind, and are wired to it here:
`functions.py` (reductions, where, clip, astype, products, creation), `shapes.py` (layout),
`index.py` (indexing), `ufuncs.py` (ufuncs and their methods).
"""

from autoclust.importers.numpy import functions, index, shapes, trace, ufuncs
from autoclust.importers.numpy.trace import OutputSlot, trace_graph

trace.FUNCTIONS.update(functions.FUNCTIONS)
trace.FUNCTIONS.update(shapes.FUNCTIONS)
trace.FUNCTIONS.update(index.FUNCTIONS)
trace.HOOKS.update(ufunc=ufuncs.lower, getitem=index.getitem, astype=functions.astype)

__all__ = ["OutputSlot", "trace_graph"]
