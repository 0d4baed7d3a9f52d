"""Clustering: which nodes compile together, and why the rest do not (a Plan)."""
