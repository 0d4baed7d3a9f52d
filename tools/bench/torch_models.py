"""Real transformers modules for `autoclust bench --torch` and the torch tests.

Each model is built from a config written here (random weights, seed 0, nothing downloaded)
at one of two sizes: "bench" (the issue-19 table: 4 layers where the model has layers,
batch 1) and "tiny" (hidden sizes of 16-32, 1-2 layers: a test compiles it in seconds).
`build(name, size)` returns the module in eval mode, wrapped to take its inputs positionally
and return `last_hidden_state`, and those inputs as tensors.

The families marked `tuned=False` were chosen before any optimization work on this backend
and are kept out of it: they are reported apart, as a check on overfitting to the others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

BENCH, TINY = "bench", "tiny"


@dataclasses.dataclass(frozen=True)
class TorchModel:
    """A transformers model family: how to build it at each size, and what feeds it."""

    title: str                                   # at the bench size
    make: Callable[[bool], tuple[Any, Any]]      # tiny -> (config, transformers module)
    feeds: Callable[[Any, bool], dict[str, Any]]  # (config, tiny) -> named input tensors
    tuned: bool = True
    extra: tuple = ()                            # fixed keyword arguments of the call


def _bert(tiny: bool) -> tuple[Any, Any]:
    from transformers import BertConfig, BertModel
    cfg = (BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, vocab_size=100, max_position_embeddings=64)
           if tiny else BertConfig(num_hidden_layers=4))
    return cfg, BertModel(cfg, add_pooling_layer=False)


def _gpt2(tiny: bool) -> tuple[Any, Any]:
    from transformers import GPT2Config, GPT2Model
    cfg = (GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=64,
                      bos_token_id=0, eos_token_id=0)
           if tiny else GPT2Config(n_layer=4))
    return cfg, GPT2Model(cfg)


def _llama(tiny: bool) -> tuple[Any, Any]:
    from transformers import LlamaConfig, LlamaModel
    sizes = ({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}
             if tiny else
             {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 32000})
    cfg = LlamaConfig(max_position_embeddings=2048, **sizes)
    return cfg, LlamaModel(cfg)


def _vit(tiny: bool) -> tuple[Any, Any]:
    from transformers import ViTConfig, ViTModel
    cfg = (ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, image_size=32, patch_size=8)
           if tiny else ViTConfig(num_hidden_layers=4))
    return cfg, ViTModel(cfg, add_pooling_layer=False)


def _resnet(tiny: bool) -> tuple[Any, Any]:
    from transformers import ResNetConfig, ResNetModel
    cfg = (ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                        layer_type="bottleneck")
           if tiny else ResNetConfig())  # bottleneck, depths [3, 4, 6, 3]: ResNet-50
    return cfg, ResNetModel(cfg)


def _t5(tiny: bool) -> tuple[Any, Any]:
    from transformers import T5Config, T5EncoderModel
    cfg = (T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, vocab_size=100)
           if tiny else T5Config(d_model=512, d_kv=64, d_ff=2048, num_layers=4, num_heads=8))
    return cfg, T5EncoderModel(cfg)


def _convnext(tiny: bool) -> tuple[Any, Any]:
    from transformers import ConvNextConfig, ConvNextModel
    cfg = (ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=32)
           if tiny else ConvNextConfig())  # ConvNeXt-T: depths [3, 3, 9, 3], 96..768 wide
    return cfg, ConvNextModel(cfg)


def _neox(tiny: bool) -> tuple[Any, Any]:
    from transformers import GPTNeoXConfig, GPTNeoXModel
    sizes = ({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "vocab_size": 100}
             if tiny else
             {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 4,
              "num_attention_heads": 8, "vocab_size": 32000})
    cfg = GPTNeoXConfig(max_position_embeddings=2048, **sizes)
    return cfg, GPTNeoXModel(cfg)


def _ids(seq: int, tiny_seq: int, mask: bool = False
         ) -> Callable[[Any, bool], dict[str, Any]]:
    def make(cfg: Any, tiny: bool) -> dict[str, Any]:
        import torch
        n = tiny_seq if tiny else seq
        gen = torch.Generator().manual_seed(0)
        out = {"input_ids": torch.randint(0, cfg.vocab_size, (1, n), generator=gen)}
        if mask:
            out["attention_mask"] = torch.ones(1, n, dtype=torch.int64)
        return out
    return make


def _pixels(cfg: Any, tiny: bool) -> dict[str, Any]:
    import torch
    size = 32 if tiny else getattr(cfg, "image_size", 224)
    gen = torch.Generator().manual_seed(0)
    return {"pixel_values": torch.randn(1, 3, size, size, generator=gen)}


NO_CACHE = (("use_cache", False),)
MODELS: dict[str, TorchModel] = {
    "bert": TorchModel("BertModel (4 layers, seq 128, with mask)", _bert,
                       _ids(128, 16, mask=True)),
    "gpt2": TorchModel("GPT2Model (4 layers, seq 64)", _gpt2, _ids(64, 16), extra=NO_CACHE),
    "llama": TorchModel("LlamaModel (512 wide, GQA 8/2, 4 layers, seq 128)", _llama,
                        _ids(128, 16), extra=NO_CACHE),
    "vit": TorchModel("ViTModel (4 layers, 224x224)", _vit, _pixels),
    "resnet": TorchModel("ResNetModel (ResNet-50, 224x224)", _resnet, _pixels),
    # not tuned for (chosen before optimizing; see the module docstring)
    "t5": TorchModel("T5EncoderModel (512 wide, 4 layers, seq 128)", _t5, _ids(128, 16),
                     tuned=False),
    "convnext": TorchModel("ConvNextModel (ConvNeXt-T, 224x224)", _convnext, _pixels,
                           tuned=False),
    "neox": TorchModel("GPTNeoXModel (512 wide, 4 layers, seq 128)", _neox, _ids(128, 16),
                       tuned=False, extra=NO_CACHE),
}


def build(name: str, size: str = BENCH) -> tuple[Any, tuple[Any, ...]]:
    """(eval-mode module taking the inputs positionally -> last_hidden_state, inputs)."""
    import torch
    spec = MODELS[name]
    tiny = size == TINY
    torch.manual_seed(0)
    cfg, model = spec.make(tiny)
    feeds = spec.feeds(cfg, tiny)
    names, extra = list(feeds), dict(spec.extra)

    class Last(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: Any) -> Any:
            return self.model(**dict(zip(names, args)), **extra).last_hidden_state

    return Last().eval(), tuple(feeds.values())
