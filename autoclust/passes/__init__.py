"""The cluster optimizer's passes, one module each; `optimize.py` lists their order
(`PASSES`) and runs them to a fixed point.

Each pass is `Graph -> Graph` on a graph with concrete shapes (after `specialize`), edits
through use-def links, and keeps the graph's inputs and the meaning of its outputs.
"""

from autoclust.passes.cse import cse
from autoclust.passes.dce import dce
from autoclust.passes.edits import copy_graph
from autoclust.passes.fold_constants import fold_constants
from autoclust.passes.siblings import fuse_siblings
from autoclust.passes.simplify import simplify
from autoclust.passes.specialize import not_concrete, specialize

__all__ = ["copy_graph", "cse", "dce", "fold_constants", "fuse_siblings", "not_concrete", "simplify",
           "specialize"]
