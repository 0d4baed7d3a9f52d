"""`import autoclust.ray as acr`: batch inference on Ray Data (`pip install "autoclust[serve]"`).

    ds = ray.data.read_parquet(...).map_batches(acr.Predictor("model.onnx"), batch_size=64,
                                                concurrency=4)

A front door: the implementation is `autoclust.serve` (serve/predictor.py), reached through
the registry (as every front door reaches the layers beside it) when a name is first used.
"""

from typing import Any

from autoclust import registry


def __getattr__(name: str) -> Any:
    return registry.ray_api(name)


def __dir__() -> list[str]:
    return sorted(registry.RAY_API)
