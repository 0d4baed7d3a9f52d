"""`autoclust fuzz`: random graphs compiled and compared with onnxruntime."""
