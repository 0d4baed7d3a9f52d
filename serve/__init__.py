"""Serving and scale-out: `autoclust serve` on Ray Serve, batch inference on Ray Data.

    protocol.py    the KServe v2 / Triton HTTP protocol: parse, check, limits, encode
    endpoint.py    one model behind the protocol (routes, session, explain); plain Python
    batching.py    dynamic batching along the model's batch dim
    metrics.py     request, latency, compile and cache counts (Ray metrics in a replica)
    fleet.py       the key that authenticates the shared compile cache
    deployment.py  the Ray Serve deployment and the `autoclust serve` run loop (imports Ray)
    predictor.py   `autoclust.ray.Predictor` for `ray.data.Dataset.map_batches`
    command.py     the `autoclust serve` command line
    bench.py       the load benchmark (tritonclient callers, 1 and 2 replicas, in-process)

Only deployment.py imports Ray at module level; the rest runs and tests without it.
Install with `pip install "autoclust[serve]"`.
"""



def __getattr__(name: str):
    # `autoclust serve --help` imports this package: keep it cheap until Predictor is used
    if name in ("Predictor", "ModelPredictor"):
        from autoclust.serve import predictor
        return getattr(predictor, name)
    raise AttributeError(name)
