"""Batch inference on Ray Data: `autoclust.ray.Predictor` for `Dataset.map_batches`.

    import ray, autoclust.ray as acr
    ds = ray.data.read_parquet(...).map_batches(acr.Predictor("model.onnx"), batch_size=64,
                                                concurrency=4)

`Predictor(model, ...)` returns a callable class, so Ray Data runs it in actors (`concurrency`
of them), each building one session when it starts; every batch it gets is a dict of NumPy
columns, one per model input (a column of tensors: each row an array of the input's shape
without its batch dim), and comes back with the model's outputs added as columns. Actors
share compiled code through `cache_dir` (see fleet.py). No Ray import here: the class also
runs as a plain callable, `Predictor("m.onnx")()(batch)`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from autoclust.serve.endpoint import ServeConfig
from autoclust.serve.fleet import install_cache_key

import autoclust
from autoclust import errors


class ModelPredictor:
    """One session; NumPy batches in, the batch plus the model's outputs out."""

    def __init__(self, model: str, flags: str = "", cache_dir: str = "",
                 keep_columns: bool = True):
        install_cache_key()
        config = ServeConfig(model, flags=flags, cache_dir=cache_dir)
        self.session = autoclust.InferenceSession(model, **config.session_flags())
        self.input_names = [a.name for a in self.session.get_inputs()]
        self.output_names = [a.name for a in self.session.get_outputs()]
        self.keep_columns = keep_columns

    def __call__(self, batch: dict[str, Any]) -> dict[str, np.ndarray]:
        """The model's outputs for one batch (with the batch's own columns, by default)."""
        if not isinstance(batch, dict):
            raise errors.InvalidInputError(
                f"Predictor takes NumPy batches (a dict of column -> array), got "
                f"{type(batch).__name__}; use map_batches(..., batch_format='numpy')")
        missing = [n for n in self.input_names if n not in batch]
        if missing:
            raise errors.InvalidInputError(
                f"the batch has no column for model input(s) {', '.join(missing)}; its "
                f"columns are: {', '.join(batch) or 'none'}")
        feeds = {n: np.asarray(batch[n]) for n in self.input_names}
        outs = self.session.run(self.output_names, feeds)
        result = dict(batch) if self.keep_columns else {}
        result.update(zip(self.output_names, outs))
        return result


def Predictor(model: str, *, flags: str = "", cache_dir: str = "",
              keep_columns: bool = True) -> type[ModelPredictor]:
    """A callable class for `Dataset.map_batches`: each actor Ray Data starts builds one
    session of `model` (flags in AUTOCLUST_FLAGS syntax; `cache_dir` shared by the actors);
    a batch gets the model's outputs added (keep_columns=False: only the outputs)."""
    ServeConfig(model, flags=flags).session_flags()  # a bad flags string fails here, once

    def __init__(self: ModelPredictor) -> None:
        ModelPredictor.__init__(self, model, flags, cache_dir, keep_columns)

    return type("Predictor", (ModelPredictor,), {"__init__": __init__,
                                                 "__module__": __name__})
