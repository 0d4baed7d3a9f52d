"""The model zoo registry: builders by name, size presets, and valid feeds for any zoo model."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from autoclust.errors import InvalidInputError, ModelLoadError

from .cnn import diffusion_block, resnet_block
from .dynamic import mixed_dynamic
from .kernels import elementwise_chain, gelu, layernorm, mlp_gelu, rmsnorm_gate, softmax_mask
from .transformer import bert_encoder, llama_block
from .writer import META_DIMS, META_FEED, META_NAME

BUILDERS: dict[str, Callable[..., onnx.ModelProto]] = {
    "mlp_gelu": mlp_gelu,
    "bert_encoder": bert_encoder,
    "llama_block": llama_block,
    "resnet_block": resnet_block,
    "diffusion_block": diffusion_block,
    "elementwise_chain": elementwise_chain,
    "gelu": gelu,
    "layernorm": layernorm,
    "softmax_mask": softmax_mask,
    "rmsnorm_gate": rmsnorm_gate,
    "mixed_dynamic": mixed_dynamic,
}

# name -> preset -> builder kwargs; the "dims" entry replaces the model's default feed dims.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "mlp_gelu": {"bench": {"hidden": 1024, "dims": {"batch": 256}}},
    "bert_encoder": {"bench": {"hidden": 256, "heads": 4, "layers": 4,
                               "dims": {"batch": 8, "seq": 128}}},
    "llama_block": {"bench": {"hidden": 256, "heads": 4, "dims": {"batch": 4, "seq": 128}}},
    "resnet_block": {"bench": {"dims": {"batch": 8, "height": 64, "width": 64}}},
    "diffusion_block": {"bench": {"channels": 64, "dims": {"batch": 4, "height": 32,
                                                           "width": 32}}},
    "elementwise_chain": {"bench": {"chain_len": 32, "dims": {"n": 1 << 20}}},
    "gelu": {"bench": {"dims": {"n": 1 << 20}}},
    "layernorm": {"bench": {"d": 768, "dims": {"batch": 8, "seq": 128}}},
    "softmax_mask": {"bench": {"heads": 12, "head_dim": 64, "dims": {"batch": 8, "seq": 128}}},
    "rmsnorm_gate": {"bench": {"d": 1024, "dims": {"n": 2048}}},
    "mixed_dynamic": {"bench": {"dims": {"batch": 4096}}},
}

# Symbolic dims of models from outside the zoo (no metadata) get these sizes.
GENERIC_DIMS = {"batch": 2, "seq": 16, "sequence": 16, "n": 4096, "height": 32, "width": 32}


def build(name: str, preset: str | None = None, **kw: Any) -> onnx.ModelProto:
    """Build zoo model `name`; `preset` (e.g. "bench") picks a size, `kw` overrides builder args."""
    if name not in BUILDERS:
        raise ModelLoadError(f"unknown zoo model {name!r}; known: {', '.join(BUILDERS)}")
    args: dict[str, Any] = {}
    if preset is not None:
        presets = PRESETS.get(name, {})
        if preset not in presets:
            raise ModelLoadError(f"zoo model {name!r} has no preset {preset!r}; "
                                 f"known: {', '.join(presets) or 'none'}")
        args.update(presets[preset])
    args.update(kw)
    dims = args.pop("dims", None)
    model = BUILDERS[name](**args)
    if dims:
        _set_meta(model, META_DIMS, ",".join(f"{k}={v}" for k, v in dims.items()))
    return model


def _set_meta(model: onnx.ModelProto, key: str, value: str) -> None:
    for prop in model.metadata_props:
        if prop.key == key:
            prop.value = value
            return
    model.metadata_props.add(key=key, value=value)


def _meta(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def default_dims(model: onnx.ModelProto) -> dict[str, int]:
    """The symbolic-dim sizes feeds() uses for `model` (its zoo metadata, else GENERIC_DIMS)."""
    dims = dict(GENERIC_DIMS)
    text = _meta(model).get(META_DIMS, "")
    for item in filter(None, text.split(",")):
        key, value = item.split("=")
        dims[key] = int(value)
    return dims


def _shape(value: onnx.ValueInfoProto, dims: Mapping[str, int]) -> tuple[int, ...]:
    shape = []
    for d in value.type.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            shape.append(d.dim_value)
        elif d.dim_param in dims:
            shape.append(dims[d.dim_param])
        else:
            raise InvalidInputError(f"input {value.name!r}: no size for symbolic dim "
                                    f"{d.dim_param!r}; pass dims={{{d.dim_param!r}: N}}")
    return tuple(shape)


def _padding_lengths(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Row-major keep-masks with a random valid prefix per batch row (at least one token)."""
    batch, seq = shape[0], shape[-1]
    lengths = rng.integers(1, seq + 1, size=batch) if seq > 0 else np.zeros(batch, np.int64)
    keep = np.arange(seq)[None, :] < lengths[:, None]
    return keep.reshape((batch,) + (1,) * (len(shape) - 2) + (seq,))


def _feed(spec: str, value: onnx.ValueInfoProto, shape: tuple[int, ...],
          rng: np.random.Generator) -> np.ndarray:
    elem = value.type.tensor_type.elem_type
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    kind, *args = spec.split(":")
    if kind == "int":
        return rng.integers(int(args[0]), int(args[1]), size=shape).astype(dtype)
    if kind == "mask":
        return _padding_lengths(rng, shape).astype(dtype)
    if kind == "addmask":
        return np.where(_padding_lengths(rng, shape), 0.0, -10000.0).astype(dtype)
    if kind != "randn":
        raise InvalidInputError(f"input {value.name!r}: unknown zoo feed spec {spec!r}")
    if elem == TensorProto.BOOL:
        return rng.integers(0, 2, size=shape).astype(bool)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 2, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def feeds(name_or_model: str | onnx.ModelProto, dims: Mapping[str, int] | None = None,
          seed: int = 0) -> dict[str, np.ndarray]:
    """Valid random inputs for a zoo model (by name or ModelProto), symbolic dims from `dims`."""
    model = build(name_or_model) if isinstance(name_or_model, str) else name_or_model
    sizes = default_dims(model)
    sizes.update(dims or {})
    meta = _meta(model)
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    out = {}
    for value in model.graph.input:
        if value.name in inits:
            continue
        spec = meta.get(META_FEED + value.name, "randn")
        out[value.name] = _feed(spec, value, _shape(value, sizes), rng)
    return out


def zoo_name(model: onnx.ModelProto) -> str | None:
    """The zoo name recorded in `model`'s metadata, or None for outside models."""
    return _meta(model).get(META_NAME)
