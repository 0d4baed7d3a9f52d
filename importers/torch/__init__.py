"""The torch front end: `torch.compile(backend="autoclust")` over ATen FX graphs."""
