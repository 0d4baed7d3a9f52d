"""`import autoclust.ray as acr`: batch inference on Ray Data (`pip install "autoclust[serve]"`).

    ds = ray.data.read_parquet(...).map_batches(acr.Predictor("model.onnx"), batch_size=64,
                                                concurrency=4)

A front door: the implementation is `autoclust.serve` (serve/predictor.py).
"""

from autoclust.serve.predictor import ModelPredictor, Predictor  # noqa: F401
