"""`autoclust bench --exports`: real transformers/CNN exports, autoclust vs onnxruntime.

    autoclust bench --exports                          # all ten, writes bench_out/exports.*
    autoclust bench --exports --models gpt2,bert --rounds 9 --torch none --repeat 3
    python -m autoclust.tools.bench.exports --list

Builds each model from a transformers config written here (random weights, seed 0, nothing
downloaded), exports it with `torch.onnx.export(..., dynamo=True)` at batch 1 and caches the
.onnx file and its inputs in `--cache` (default ~/.cache/autoclust/exports), keyed by the
torch, transformers, onnxscript and onnx versions and the model's config. Five are the
architectures the project was tuned on; five more (`held_out`) nobody tuned for, reported
in a table of their own. Then each model, in its own process: onnxruntime (ORT_ENABLE_ALL,
`--threads`, spinning off) and autoclust (the same SessionOptions, `--threads`, run until
measured placement has decided), OpenVINO's CPU plugin when installed (float32, the same
threads, outputs checked), plus torch eager and torch.compile (inductor) on the same module
with torch.set_num_threads(threads) and OMP_WAIT_POLICY=PASSIVE (unless set), timed in
alternating blocks over rounds (tools/bench/timing.py), medians. Ratio = onnxruntime time /
other side's time (above 1: faster than onnxruntime), each round's (its blocks ran back to
back, in one load state of the machine), the median over rounds (`timing.round_ratio`; the
ratio of the medians over all rounds is kept in the JSON as `ratio_of_medians`). The floor ratio (whole run / GEMM
time, tools/bench/profile.py) is autoclust's compiled code's (placement off) and
onnxruntime's. `--repeat N` measures each model in N processes and gives the spread.
Needs the `bench` extra: pip install "autoclust[bench]" (openvino is in it).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
from autoclust.tools.bench import sweep, timing

EXPORT_FORMAT = 2  # bump when the export recipe below changes (part of the cache key)
INSTALL_HINT = ('pip install "autoclust[bench]"   (torch==2.13.0, transformers, onnxscript; '
                "for a CPU-only torch add --extra-index-url https://download.pytorch.org/whl/cpu)")


@dataclasses.dataclass(frozen=True)
class Spec:
    """One export: a title, a builder of (config, module) and its example inputs."""

    title: str
    build: Callable[[], tuple[Any, Any]]
    inputs: Callable[[Any], dict[str, np.ndarray]]
    shape_note: str
    extra: tuple = ()  # fixed keyword arguments of the model call
    held_out: bool = False  # an architecture nobody tuned for: reported apart
    sweep: bool = False  # of the architecture sweep (sweep.py): run when asked for, apart


def _wrap(model: Any, input_names: list[str], extra: dict[str, Any]) -> Any:
    """A module taking the inputs positionally and returning last_hidden_state."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            kwargs = dict(zip(input_names, args), **extra)
            return self.model(**kwargs).last_hidden_state

    return Wrapped()


def _bert() -> tuple[Any, Any]:
    from transformers import BertConfig, BertModel
    cfg = BertConfig()  # BERT-base: 12 layers, hidden 768, 12 heads
    return cfg, BertModel(cfg, add_pooling_layer=False)


def _gpt2() -> tuple[Any, Any]:
    from transformers import GPT2Config, GPT2Model
    cfg = GPT2Config(n_layer=4)
    return cfg, GPT2Model(cfg)


def _llama() -> tuple[Any, Any]:
    from transformers import LlamaConfig, LlamaModel
    cfg = LlamaConfig(hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=8, vocab_size=32000,
                      max_position_embeddings=2048)
    return cfg, LlamaModel(cfg)


def _vit() -> tuple[Any, Any]:
    from transformers import ViTConfig, ViTModel
    cfg = ViTConfig(num_hidden_layers=4)  # hidden 768, 12 heads, 224x224, patch 16
    return cfg, ViTModel(cfg, add_pooling_layer=False)


def _resnet50() -> tuple[Any, Any]:
    from transformers import ResNetConfig, ResNetModel
    cfg = ResNetConfig()  # bottleneck, depths [3, 4, 6, 3], widths 256..2048: ResNet-50
    return cfg, ResNetModel(cfg)


# ---- held out: architectures nobody tuned for (reported apart from the five above) ----------

def _t5() -> tuple[Any, Any]:
    from transformers import T5Config, T5EncoderModel
    cfg = T5Config(d_model=512, d_ff=2048, num_layers=6, num_heads=8, d_kv=64,
                   vocab_size=32128)  # t5-small's encoder: relative position bias, RMSNorm
    return cfg, T5EncoderModel(cfg)


def _qwen2() -> tuple[Any, Any]:
    from transformers import Qwen2Config, Qwen2Model
    cfg = Qwen2Config(hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, vocab_size=32000,
                      max_position_embeddings=2048)  # grouped-query attention, QKV bias
    return cfg, Qwen2Model(cfg)


def _whisper() -> tuple[Any, Any]:
    from transformers import WhisperConfig, WhisperModel
    # whisper-tiny's encoder (4 layers, d_model 384) on 15 s of audio (1500 mel frames)
    cfg = WhisperConfig(max_source_positions=750)
    return cfg, WhisperModel(cfg).encoder


def _convnext() -> tuple[Any, Any]:
    from transformers import ConvNextConfig, ConvNextModel
    cfg = ConvNextConfig()  # ConvNeXt-tiny: depths [3, 3, 9, 3], 7x7 depthwise, LayerNorm
    return cfg, ConvNextModel(cfg)


def _swin() -> tuple[Any, Any]:
    from transformers import SwinConfig, SwinModel
    cfg = SwinConfig()  # Swin-tiny: windowed attention, patch merging, 224x224
    return cfg, SwinModel(cfg, add_pooling_layer=False)


def _ids(seq: int, mask: bool = False, decoder: bool = False
         ) -> Callable[[Any], dict[str, np.ndarray]]:
    """Token ids (seed 0), with an all-ones mask, or the same ids as the decoder's."""
    def make(cfg: Any) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(0)
        out = {"input_ids": rng.integers(0, cfg.vocab_size, (1, seq)).astype(np.int64)}
        if mask:
            out["attention_mask"] = np.ones((1, seq), np.int64)
        if decoder:
            out["decoder_input_ids"] = out["input_ids"].copy()
        return out
    return make


def _mel(cfg: Any) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    frames = 2 * cfg.max_source_positions
    return {"input_features":
            rng.standard_normal((1, cfg.num_mel_bins, frames)).astype(np.float32)}


def _image(size: int | None = None) -> Callable[[Any], dict[str, np.ndarray]]:
    """One image (seed 0) of `size`, else of the config's image_size (224 without one)."""
    def make(cfg: Any) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(0)
        side = size or getattr(cfg, "image_size", 224)
        return {"pixel_values": rng.standard_normal((1, 3, side, side)).astype(np.float32)}
    return make


_pixels = _image()


SPECS: dict[str, Spec] = {
    "bert": Spec("BERT-base, seq 128", _bert, _ids(128, mask=True), "ids+mask [1,128]"),
    "gpt2": Spec("GPT-2 (4 layers, seq 64)", _gpt2, _ids(64), "ids [1,64]",
                 (("use_cache", False),)),
    "llama": Spec("LLaMA-like (4 layers, hidden 512, seq 128)", _llama, _ids(128),
                  "ids [1,128]", (("use_cache", False),)),
    "vit": Spec("ViT (4 layers, 224x224)", _vit, _pixels, "pixels [1,3,224,224]"),
    "resnet50": Spec("ResNet-50 (224x224)", _resnet50, _pixels, "pixels [1,3,224,224]"),
    # held out
    "t5": Spec("T5-small encoder (seq 128)", _t5, _ids(128, mask=True), "ids+mask [1,128]",
               held_out=True),
    "qwen2": Spec("Qwen2-like GQA decoder (4 layers, hidden 512, seq 128)", _qwen2, _ids(128),
                  "ids [1,128]", (("use_cache", False),), held_out=True),
    "whisper": Spec("Whisper-tiny encoder (1500 frames)", _whisper, _mel,
                    "mel [1,80,1500]", held_out=True),
    "convnext": Spec("ConvNeXt-tiny (224x224)", _convnext, _pixels, "pixels [1,3,224,224]",
                     held_out=True),
    "swin": Spec("Swin-tiny (224x224)", _swin, _pixels, "pixels [1,3,224,224]",
                 held_out=True),
}
TUNED = [n for n, s in SPECS.items() if not s.held_out]
HELD_OUT = [n for n, s in SPECS.items() if s.held_out]
DEFAULT = TUNED + HELD_OUT  # the exports table; the sweep's models run when named


def _sweep_inputs(kind: tuple) -> Callable[[Any], dict[str, np.ndarray]]:
    """Input makers of sweep.py's descriptors (seed 0 each call)."""
    if kind[0] == "ids":
        return _ids(sweep.SEQ, mask=kind[1])
    if kind[0] == "ids+decoder":
        return _ids(sweep.SEQ, decoder=True)
    if kind[0] == "pixels":
        return _image(kind[1])
    return lambda cfg: {"input_values": np.random.default_rng(0).standard_normal(
        (1, kind[1])).astype(np.float32)}


SPECS.update({name: Spec(title, functools.partial(sweep.build, name), _sweep_inputs(kind),
                         f"{kind[0]} (fixed shapes)",
                         (("use_cache", False),) if kind == ("ids", False) else (),
                         held_out=True, sweep=True)
              for name, (title, kind, *_) in sweep.ARCHS.items()})


def model_names(arg: str) -> list[str]:
    """--models: names, `sweep` (all of sweep.py's) or `sweep:a,b`; empty: the ten."""
    if not arg:
        return list(DEFAULT)
    if arg == "sweep":
        return list(sweep.ARCHS)
    return [m for m in arg.removeprefix("sweep:").split(",") if m]


def require() -> None:
    """Raise SystemExit with the install line when the bench extra is missing."""
    missing = []
    for mod in ("torch", "transformers", "onnxscript"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise SystemExit(f"autoclust bench --exports needs {', '.join(missing)}: {INSTALL_HINT}")


def dynamic_shapes(inputs: dict[str, np.ndarray]) -> Any:
    """torch.export's dynamic_shapes: token inputs get a symbolic `seq` dim (as a deployed
    export has), images stay static. One tuple: Wrapped.forward takes *args."""
    if "input_ids" not in inputs:
        return None
    import torch
    seq = torch.export.Dim("seq", min=2, max=512)
    return (tuple({1: seq} for _ in inputs),)


def new_seq_feeds(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """The feeds at 3/4 of their sequence length (a new signature), or None for images."""
    if "input_ids" not in feeds:
        return None
    seq = feeds["input_ids"].shape[1] * 3 // 4
    return {k: np.ascontiguousarray(v[:, :seq]) for k, v in feeds.items()}


def build_module(name: str) -> tuple[Any, Any, dict[str, np.ndarray]]:
    """(config, eval-mode wrapped module with seed-0 random weights, numpy inputs)."""
    import torch
    spec = SPECS[name]
    torch.manual_seed(0)
    cfg, model = spec.build()
    model.eval()
    inputs = spec.inputs(cfg)
    return cfg, _wrap(model, list(inputs), dict(spec.extra)).eval(), inputs


def cache_key(name: str, cfg: Any) -> str:
    """Versions + config + recipe: any change gives a new export."""
    import onnx
    import onnxscript
    import torch
    import transformers
    text = json.dumps({"name": name, "format": EXPORT_FORMAT, "torch": torch.__version__,
                       "transformers": transformers.__version__, "onnx": onnx.__version__,
                       "onnxscript": onnxscript.__version__, "config": cfg.to_json_string(),
                       "shape": SPECS[name].shape_note,
                       "extra": repr(SPECS[name].extra)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def default_cache() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "autoclust", "exports")


def export(name: str, cache: str, log: Callable[[str], None] = print) -> tuple[str, str]:
    """(model path, inputs .npz path) of model `name`, exported now unless cached."""
    import onnx
    import torch
    cfg, module, inputs = build_module(name)
    stem = os.path.join(cache, f"{name}-{cache_key(name, cfg)}")
    path, feeds = stem + ".onnx", stem + ".inputs.npz"
    if os.path.exists(path) and os.path.exists(feeds):
        return path, feeds
    os.makedirs(cache, exist_ok=True)
    log(f"exporting {name} (torch.onnx.export dynamo=True) -> {path}")
    args = tuple(torch.from_numpy(x) for x in inputs.values())
    with torch.no_grad():
        program = torch.onnx.export(module, args, dynamo=True, input_names=list(inputs),
                                    output_names=["last_hidden_state"], verbose=False,
                                    dynamic_shapes=None if SPECS[name].sweep else
                                    dynamic_shapes(inputs))
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        program.save(os.path.join(tmp, "m.onnx"))
        model = onnx.load(os.path.join(tmp, "m.onnx"))
    model.ir_version = min(model.ir_version, 10)  # as the zoo: onnxruntime 1.31 reads <= 13
    onnx.save(model, path + ".tmp")
    np.savez(feeds + ".tmp.npz", **inputs)
    os.replace(feeds + ".tmp.npz", feeds)
    os.replace(path + ".tmp", path)  # last: a complete pair or nothing
    return path, feeds


# ---- measuring one model (in its own process) ------------------------------------------------

def _torch_sides(name: str, inputs: dict[str, np.ndarray], threads: int, which: list[str],
                 row: dict[str, Any], want: list[np.ndarray]) -> dict[str, Callable[[], Any]]:
    """Callables for torch eager / torch.compile; records their first run and error in row."""
    import torch
    torch.set_num_threads(threads)
    _, module, _ = build_module(name)
    args = tuple(torch.from_numpy(x) for x in inputs.values())
    sides: dict[str, Callable[[], Any]] = {}
    for side in which:
        fn = module if side == "eager" else torch.compile(module)

        def run(fn: Any = fn) -> Any:
            with torch.inference_mode():
                return fn(*args)

        out, row[f"{side}_first_ms"] = timing.timed_ms(run)
        row[f"{side}_err"] = timing.max_abs_err([out.numpy()], want)
        sides[side] = run
    return sides


def _openvino_side(model_path: str, feeds: dict[str, np.ndarray], threads: int,
                   row: dict[str, Any], want: list[np.ndarray]) -> Callable[[], Any] | None:
    """OpenVINO's CPU plugin on the same export (float32, `threads` threads, latency
    hint), its outputs checked against onnxruntime; None when openvino is not installed."""
    try:
        import openvino as ov
    except ImportError:
        return None
    core = ov.Core()
    compiled, row["openvino_compile_ms"] = timing.timed_ms(lambda: core.compile_model(
        model_path, "CPU", {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32",
                            "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}))
    request = compiled.create_infer_request()

    def run() -> Any:
        return request.infer(feeds)

    out = run()
    row["openvino_err"] = timing.max_abs_err([out[compiled.output(0)]], want[:1])
    return run


def _floor(row: dict[str, Any], model_path: str, feeds_path: str, threads: int,
           flags: str) -> None:
    """GEMM time and floor ratio of each side (tools/bench/profile.py, in a process of its
    own), autoclust's with measured placement off so the figure is its compiled code's."""
    with tempfile.TemporaryDirectory(prefix="autoclust-floor-") as tmp:
        out = os.path.join(tmp, "profile.json")
        proc = subprocess.run(
            [sys.executable, "-m", "autoclust.tools.bench.profile", model_path, "--feeds",
             feeds_path, "--threads", str(threads), "--rounds", "3", "--block", "2",
             f"--flags={flags} --autotune=false", "--json", out],
            check=False, capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(out):
            row["floor_error"] = (proc.stderr.strip().splitlines() or ["failed"])[-1][:300]
            return
        with open(out) as f:
            row["floor"] = json.load(f)["floor"]


def run_one(name: str, model_path: str, feeds_path: str, threads: int, rounds: int,
            block: int, torch_sides: list[str], flags: str = "", openvino: bool = True,
            floor: bool = True) -> dict[str, Any]:
    """Measure one exported model in this process; returns its result row."""
    import onnx
    model = onnx.load(model_path)
    with np.load(feeds_path) as z:
        feeds = {k: z[k] for k in z.files}
    row: dict[str, Any] = {"model": name, "title": SPECS[name].title, "threads": threads,
                           "onnx_nodes": len(model.graph.node)}
    ref = timing.ort_session(model, threads)
    want = ref.run(None, feeds)
    sess, row["session_ms"] = timing.timed_ms(
        lambda: timing.autoclust_session(model_path, threads, flags))
    got, row["first_run_ms"] = timing.timed_ms(lambda: sess.run(None, feeds))
    row["max_abs_err"] = timing.max_abs_err(got, want)
    row["max_abs_out"] = float(max(np.max(np.abs(w)) for w in want))
    stats = sess.stats()["clusters"]
    row["clusters"] = len(stats)
    row["kernels"] = sum(k for c in stats for k in c["kernels"])
    row["fallbacks"] = [c["fallback"] for c in stats if c["fallback"]]
    if sess.plan is not None:
        row["segments"] = len(sess.plan.steps) - len(sess.plan.clusters)
    # the steady state: weights' prepacked onnxruntime sessions are built in the background
    # after the first run (backends/cpu/library.py); time runs once they are in place
    from autoclust.backends.cpu import library
    library.wait_background(timeout=60)
    row["settle_runs"] = timing.settle(sess, feeds)  # measured placement decides
    row["placement"] = timing.placement(sess)
    ort_side = lambda: ref.run(None, feeds)
    sides: dict[str, Callable[[], Any]] = {"ort": ort_side,
                                           "autoclust": lambda: sess.run(None, feeds)}
    if torch_sides:
        sides.update(_torch_sides(name, feeds, threads, torch_sides, row, want))
    times = timing.alternate(sides, rounds, block)
    for side, samples in times.items():
        row[f"{side}_ms"] = timing.median_ms(samples)
    row["ratio_of_medians"] = row["ort_ms"] / row["autoclust_ms"]
    row["ratio"] = timing.round_ratio(times, "ort", "autoclust", block)
    row["ratio_p25"], row["ratio_p75"] = timing.ratio_spread(times, "ort", "autoclust", block)
    # OpenVINO after autoclust's timing, against onnxruntime alone: its TBB workers spin
    # after each inference and took the cores from the side timed next (a 5 ms BLOOM-like
    # export read 0.79x with OpenVINO made in the process, 1.04-1.08x without)
    ov_side = _openvino_side(model_path, feeds, threads, row, want) if openvino else None
    if ov_side is not None:
        ov_times = timing.alternate({"ort": ort_side, "openvino": ov_side}, rounds, block)
        row["openvino_ms"] = timing.median_ms(ov_times["openvino"])
        row["openvino_ratio"] = timing.round_ratio(ov_times, "ort", "openvino", block)
    if not SPECS[name].sweep:  # the sweep's exports have fixed shapes
        _new_seq(row, sess, ref, feeds)
    if floor:
        _floor(row, model_path, feeds_path, threads, flags)
    row["load"] = timing.load_note()
    return row


def _new_seq(row: dict[str, Any], sess: Any, ref: Any, feeds: dict[str, np.ndarray]) -> None:
    """First run at a new sequence length (after the timing: it adds a signature)."""
    alt = new_seq_feeds(feeds)
    if alt is None:
        return
    got, row["new_seq_ms"] = timing.timed_ms(lambda: sess.run(None, alt))
    row["new_seq"] = int(alt["input_ids"].shape[1])
    row["new_seq_err"] = timing.max_abs_err(got, ref.run(None, alt))


def cached_run(model_path: str, feeds_path: str, threads: int, flags: str) -> dict[str, Any]:
    """Session + first run in a fresh process whose --cache_dir an earlier one filled."""
    with np.load(feeds_path) as z:
        feeds = {k: z[k] for k in z.files}
    sess, session_ms = timing.timed_ms(lambda: timing.autoclust_session(model_path, threads,
                                                                        flags))
    _, first_ms = timing.timed_ms(lambda: sess.run(None, feeds))
    return {"cached_session_ms": session_ms, "cached_first_run_ms": first_ms}


# ---- the table -------------------------------------------------------------------------------

def _err(r: dict[str, Any], side: str) -> str:
    value = r.get(f"{side}_err" if side != "autoclust" else "max_abs_err")
    return "" if value is None else f"{value:.1e}"


def _s(ms: float | None) -> str:
    return "" if ms is None else f"{ms / 1e3:.2f}"


def _placement_note(r: dict[str, Any]) -> str:
    """`compiled`, `onnxruntime`, or counts: where measured placement put the clusters."""
    winners = [d["winner"] for d in r.get("placement", [])]
    if not winners:
        return "none measured" if r.get("clusters") else "no clusters"
    kinds = sorted(set(winners))
    if len(kinds) == 1:
        return kinds[0] + (f" (all {len(winners)})" if len(winners) > 1 else "")
    return ", ".join(f"{winners.count(k)} {k}" for k in kinds)


def _runs(r: dict[str, Any], key: str) -> str:
    """min-max of a figure over the repeated processes (--repeat), else the in-run spread."""
    values = r.get(f"{key}_runs") or []
    if len(values) > 1:
        return f"{min(values):.2f}-{max(values):.2f} ({len(values)} runs)"
    if key == "ratio" and "ratio_p25" in r:
        return f"{r['ratio_p25']:.2f}-{r['ratio_p75']:.2f} (p25-p75)"
    return ""


def _floor_cells(r: dict[str, Any]) -> list[str]:
    fl = r.get("floor")
    if not fl:
        return ["", ""]
    ours, theirs = fl["autoclust"], fl["onnxruntime"]
    return [f"{ours['floor_ratio']:.2f} / {theirs['floor_ratio']:.2f}",
            f"{ours['gemm_ms']:.1f} / {theirs['gemm_ms']:.1f}"]


SPEED_HEADER = ["model", "onnxruntime ms", "autoclust ms", "ratio", "ratio spread",
                "OpenVINO ms", "OpenVINO ratio", "floor ratio autoclust / onnxruntime",
                "GEMM+Conv ms autoclust / onnxruntime", "placement",
                "max abs err (autoclust / OpenVINO)",
                "clusters / segments / kernels"]


def _speed_row(r: dict[str, Any], torch_cols: bool) -> list[str]:
    if "error" in r:
        return [r["model"], "error: " + r["error"]] + [""] * (len(SPEED_HEADER) - 2 +
                                                            2 * torch_cols)
    ov = r.get("openvino_ratio")
    row = [r["title"], timing.fmt_ms(r["ort_ms"]), timing.fmt_ms(r["autoclust_ms"]),
           f"**{r['ratio']:.2f}x**", _runs(r, "ratio"), timing.fmt_ms(r.get("openvino_ms")),
           "" if ov is None else f"{ov:.2f}x", *_floor_cells(r), _placement_note(r),
           " / ".join(e for e in (_err(r, "autoclust"), _err(r, "openvino")) if e),
           f"{r['clusters']} / {r.get('segments', 0)} / {r['kernels']}"]
    if torch_cols:
        row += [timing.fmt_ms(r.get("eager_ms")), timing.fmt_ms(r.get("inductor_ms"))]
    return row


def _speed_table(rows: list[dict[str, Any]], torch_cols: bool) -> str:
    lines = [_speed_row(r, torch_cols) for r in rows]
    ok = [r for r in rows if "ratio" in r]
    if len(ok) > 1:
        ov = [r["openvino_ratio"] for r in ok if "openvino_ratio" in r]
        lines.append(["geomean", "", "", f"**{timing.geomean([r['ratio'] for r in ok]):.2f}x**",
                      "", "", f"{timing.geomean(ov):.2f}x" if ov else ""]
                     + [""] * (len(SPEED_HEADER) - 7 + 2 * torch_cols))
    header = SPEED_HEADER + (["torch eager ms", "torch.compile ms"] if torch_cols else [])
    return timing.table(header, lines)


def markdown(rows: list[dict[str, Any]]) -> str:
    """The speed tables (tuned and held-out architectures apart, each with a geomean) and
    the latency table of the exports."""
    torch_cols = any("eager_ms" in r or "inductor_ms" in r for r in rows)
    tuned = [r for r in rows if not SPECS[r["model"]].held_out]
    held = [r for r in rows if SPECS[r["model"]].held_out and not SPECS[r["model"]].sweep]
    swept = [r for r in rows if SPECS[r["model"]].sweep]
    parts = []
    if tuned:
        parts.append("Tuned for (the five the project was developed on):\n\n"
                     + _speed_table(tuned, torch_cols))
    if held:
        parts.append("Held out (architectures nobody tuned for):\n\n"
                     + _speed_table(held, torch_cols))
    if swept:
        parts.append("Architecture sweep (tools/bench/sweep.py; small sizes, fixed shapes):"
                     "\n\n" + _speed_table(swept, torch_cols))
    latency = []
    for r in rows:
        if "error" in r:
            continue
        new_seq = f"{_s(r['new_seq_ms'])} (seq {r['new_seq']})" if "new_seq_ms" in r else "n/a"
        latency.append([r["title"], _s(r["session_ms"]), _s(r["first_run_ms"]),
                        str(r.get("settle_runs", "")), new_seq,
                        _s(r.get("cached_session_ms")), _s(r.get("cached_first_run_ms")),
                        _s(r.get("inductor_first_ms"))])
    parts.append(timing.table(
        ["model", "autoclust session s", "autoclust first run s", "runs to settle placement",
         "new seq length, first run s", "2nd process --cache_dir: session s", "first run s",
         "torch.compile first run s"], latency))
    return "\n".join(parts)


def combine(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from the same model measured in several processes: the one with the median
    ratio, plus every process's ratios (`ratio_runs`, `openvino_ratio_runs`)."""
    ok = [r for r in rows if "ratio" in r]
    if not ok:
        return rows[0]
    ok.sort(key=lambda r: r["ratio"])
    out = dict(ok[(len(ok) - 1) // 2])
    out["ratio_runs"] = [r["ratio"] for r in ok]
    out["openvino_ratio_runs"] = [r["openvino_ratio"] for r in ok if "openvino_ratio" in r]
    return out


def _versions() -> dict[str, str]:
    import llvmlite
    import onnx
    import onnxruntime
    out = {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
           "llvmlite": llvmlite.__version__}
    for mod in ("torch", "transformers", "onnxscript"):
        try:
            out[mod] = __import__(mod).__version__
        except ImportError:
            pass
    return out


def _child(args: argparse.Namespace, name: str, path: str, feeds: str) -> dict[str, Any]:
    """Measure one model in a process of its own, then its cached start in a second one."""
    with tempfile.TemporaryDirectory(prefix="autoclust-bench-cache-") as cache_dir:
        flags = f"{args.flags} --cache_dir={cache_dir}".strip()
        common = ["--model-path", path, "--feeds-path", feeds, "--threads", str(args.threads),
                  f"--flags={flags}"]
        extra = ["--no-openvino"] * args.no_openvino + ["--no-floor"] * args.no_floor
        row = _subprocess(name, ["--one", name, "--rounds", str(args.rounds), "--block",
                                 str(args.block), "--torch", args.torch] + extra + common)
        if "error" not in row:
            row.update(_subprocess(name, ["--cached", name] + common))
    return row


def compile_bytecode() -> None:
    """Compile autoclust's modules to bytecode before the measured processes start, as
    `pip install` does. From an editable checkout with PYTHONDONTWRITEBYTECODE set (these
    build machines), every child process compiled autoclust's sources again: ~0.5 s of its
    imports and 0.03-0.05 s of the first run (modules a first run imports lazily), which
    an installed package never pays. A directory we cannot write is left as it is."""
    import compileall
    import importlib

    for pkg in ("autoclust", "autoclust.backends", "autoclust.importers", "autoclust.tools"):
        path = os.path.dirname(importlib.import_module(pkg).__file__ or "")
        if os.path.isdir(path):  # one tree in an install, four in an editable checkout
            compileall.compile_dir(path, quiet=2)


def _subprocess(name: str, argv: list[str]) -> dict[str, Any]:
    """The JSON line a child `python -m autoclust.tools.bench.exports ARGV` prints last."""
    # torch's OpenMP threads spin at barriers by default: under load (or beside another
    # side's threads) a 2-thread GPT-2 eager run took 858 ms instead of 145 ms. PASSIVE is
    # torch's counterpart of onnxruntime's allow_spinning=0.
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    proc = subprocess.run([sys.executable, "-m", "autoclust.tools.bench.exports"] + argv,
                          check=False, capture_output=True, text=True, env=env)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        return {"model": name, "error": tail[:300]}
    return json.loads(lines[-1])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autoclust bench --exports",
                                description=__doc__.splitlines()[0])
    p.add_argument("--models", default="", help=f"comma-separated of {', '.join(DEFAULT)} "
                   "(default: these ten), or `sweep` (tools/bench/sweep.py's 28), or "
                   "`sweep:NAME,...`")
    p.add_argument("--list", action="store_true", help="list the models and exit")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--block", type=int, default=3, help="timed runs per side per round")
    p.add_argument("--torch", default="eager,inductor",
                   help="comma-separated torch sides: eager, inductor (default: both), or none")
    p.add_argument("--flags", default="", help="AUTOCLUST_FLAGS for the autoclust side")
    p.add_argument("--cache", default=default_cache(), help="export cache directory")
    p.add_argument("--export-only", action="store_true", help="export (or find) and stop")
    p.add_argument("--out", default="bench_out")
    p.add_argument("--repeat", type=int, default=1, help="measure each model in this many "
                   "processes (each with a fresh --cache_dir); the table gives the spread")
    p.add_argument("--no-openvino", action="store_true", help="leave OpenVINO out (it is "
                   "measured when `pip install openvino` is there)")
    p.add_argument("--no-floor", action="store_true", help="skip the GEMM-floor profile")
    for hidden in ("--one", "--cached", "--model-path", "--feeds-path"):  # internal
        p.add_argument(hidden, default="", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.list:
        for name, spec in SPECS.items():
            print(f"{name:10s} {spec.title}  ({spec.shape_note})")
        return 0
    torch_sides = [s for s in args.torch.split(",") if s and s != "none"]
    bad = [s for s in torch_sides if s not in ("eager", "inductor")]
    names = model_names(args.models)
    unknown = [m for m in names if m not in SPECS]
    if bad or unknown:
        print(f"autoclust bench --exports: unknown {'torch side' if bad else 'model'}(s) "
              f"{bad or unknown}; known: {'eager, inductor' if bad else ', '.join(SPECS)}",
              file=sys.stderr)
        return 2
    if args.cached:
        print(json.dumps(cached_run(args.model_path, args.feeds_path, args.threads,
                                    args.flags)))
        return 0
    if args.one:
        print(json.dumps(run_one(args.one, args.model_path, args.feeds_path, args.threads,
                                 args.rounds, args.block, torch_sides, args.flags,
                                 openvino=not args.no_openvino, floor=not args.no_floor)))
        return 0
    require()
    paths = {name: export(name, args.cache) for name in names}
    if args.export_only:
        for name, (path, _) in paths.items():
            print(f"{name:10s} {path}")
        return 0
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    compile_bytecode()
    for _ in range(max(args.repeat, 1)):  # repeats of the whole list: load moves apart
        for name in names:
            row = _child(args, name, *paths[name])
            runs[name].append(row)
            print(f"{name:10s} " + (
                f"ort {row['ort_ms']:8.2f} ms  autoclust {row['autoclust_ms']:8.2f} ms  ratio "
                f"{row['ratio']:5.2f}x  openvino {row.get('openvino_ratio', 0):5.2f}x  "
                f"placement {_placement_note(row)}" if "ratio" in row
                else f"error: {row['error']}"), flush=True)
    rows = [combine(runs[name]) for name in names]
    os.makedirs(args.out, exist_ok=True)
    meta = {"versions": _versions(), "threads": args.threads, "rounds": args.rounds,
            "block": args.block, "repeat": args.repeat, "load_after": timing.load_note(),
            "command": "autoclust bench --exports " + " ".join(argv or sys.argv[1:])}
    with open(os.path.join(args.out, "exports.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=2)
    text = markdown(rows)
    with open(os.path.join(args.out, "exports.md"), "w") as f:
        f.write(text)
    print(text + f"wrote {args.out}/exports.json, exports.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
