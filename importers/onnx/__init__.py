"""The ONNX front end: ModelProto <-> autoclust IR.

`load.py` reads a model (older opset forms rewritten by `forms.py`) into a Graph;
`export.py` writes a Graph back as ONNX (fallback sub-models and dumps are ONNX).
The core reaches this package through `autoclust.registry.importer("onnx")`.
"""

from autoclust.importers.onnx.export import export_model, external_stubs
from autoclust.importers.onnx.load import fill_types, import_model, load_model_proto, outer_reads

__all__ = ["export_model", "external_stubs", "fill_types", "import_model", "load_model_proto",
           "outer_reads"]
