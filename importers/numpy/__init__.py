"""The NumPy front end: `autoclust.jit` / `autoclust.trace` trace functions into graphs."""
