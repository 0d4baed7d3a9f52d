"""Kernel IR and the steps that make it: lowering, fusion, kernel passes, memory plan."""
