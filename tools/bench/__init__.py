"""`autoclust bench`: speed against onnxruntime, torch and the machine's limits."""
