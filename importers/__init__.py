"""Model formats -> autoclust IR. ONNX: import_model / export_model."""

from autoclust.importers.onnx import export_model, import_model, load_model_proto

__all__ = ["export_model", "import_model", "load_model_proto"]
