"""The architecture sweep: 28 more transformers models nobody tuned for, at small sizes.

    autoclust bench --exports --models sweep --torch none --no-openvino --no-floor
    autoclust bench --exports --models sweep:bloom,segformer ...

A wide net for "never slower than onnxruntime, never wrong": encoders, decoders (ALiBi,
multi-query, sliding-window, parallel-attention and partial-rotary ones), an
encoder-decoder, vision transformers, CNNs of 1x1 and depthwise convolutions, and an audio
model, each built from a transformers config written here (2 layers where a stack is
configurable, random weights, seed 0, nothing downloaded) and exported at fixed shapes
(`torch.onnx.export(..., dynamo=True)`, batch 1, sequence 64 or 224x224 images). The ten
models of the exports table are the default list; these run only when asked for
(exports.py turns each entry into its Spec, with `sweep=True`, reported in a table of
their own). Measured 2026-12-06: docs/performance.md, "Seventeenth session".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SEQ = 64

# name -> (title, builder of (config, model), inputs: ("ids", mask?) | ("ids+decoder",)
#          | ("pixels", size) | ("audio", samples))
ARCHS: dict[str, tuple[str, Callable[[], tuple[Any, Any]], tuple]] = {}


def _arch(name: str, title: str, inputs: tuple) -> Callable:
    def register(build: Callable[[], tuple[Any, Any]]) -> Callable[[], tuple[Any, Any]]:
        ARCHS[name] = (title, build, inputs)
        return build
    return register


def _t() -> Any:
    import transformers
    return transformers


@_arch("distilbert", "DistilBERT (2 layers)", ("ids", True))
def _distilbert() -> tuple[Any, Any]:
    c = _t().DistilBertConfig(n_layers=2)
    return c, _t().DistilBertModel(c)


@_arch("roberta", "RoBERTa (2 layers)", ("ids", True))
def _roberta() -> tuple[Any, Any]:
    c = _t().RobertaConfig(num_hidden_layers=2)
    return c, _t().RobertaModel(c, add_pooling_layer=False)


@_arch("deberta", "DeBERTa-v2 (2 layers, hidden 384, disentangled attention)", ("ids", True))
def _deberta() -> tuple[Any, Any]:
    c = _t().DebertaV2Config(num_hidden_layers=2, hidden_size=384, num_attention_heads=6,
                             intermediate_size=1536)
    return c, _t().DebertaV2Model(c)


@_arch("albert", "ALBERT (2 layers, shared weights)", ("ids", True))
def _albert() -> tuple[Any, Any]:
    c = _t().AlbertConfig(num_hidden_layers=2)
    return c, _t().AlbertModel(c, add_pooling_layer=False)


@_arch("mpnet", "MPNet (2 layers, relative position buckets)", ("ids", True))
def _mpnet() -> tuple[Any, Any]:
    c = _t().MPNetConfig(num_hidden_layers=2)
    return c, _t().MPNetModel(c, add_pooling_layer=False)


@_arch("electra", "ELECTRA-small-like (2 layers)", ("ids", True))
def _electra() -> tuple[Any, Any]:
    c = _t().ElectraConfig(num_hidden_layers=2)
    return c, _t().ElectraModel(c)


@_arch("convbert", "ConvBERT (2 layers, span-based dynamic convolution)", ("ids", True))
def _convbert() -> tuple[Any, Any]:
    c = _t().ConvBertConfig(num_hidden_layers=2)
    return c, _t().ConvBertModel(c)


@_arch("squeezebert", "SqueezeBERT (2 layers, grouped 1-D convolutions)", ("ids", True))
def _squeezebert() -> tuple[Any, Any]:
    c = _t().SqueezeBertConfig(num_hidden_layers=2)
    return c, _t().SqueezeBertModel(c)


@_arch("cliptext", "CLIP text encoder (2 layers, causal mask)", ("ids", True))
def _cliptext() -> tuple[Any, Any]:
    c = _t().CLIPTextConfig(num_hidden_layers=2)
    return c, _t().CLIPTextModel(c)


@_arch("bloom", "BLOOM-like (2 layers, ALiBi)", ("ids", True))
def _bloom() -> tuple[Any, Any]:
    c = _t().BloomConfig(n_layer=2, hidden_size=512, n_head=8)
    return c, _t().BloomModel(c)


@_arch("falcon", "Falcon-like (2 layers, multi-query, parallel attention)", ("ids", False))
def _falcon() -> tuple[Any, Any]:
    c = _t().FalconConfig(num_hidden_layers=2, hidden_size=512, num_attention_heads=8,
                          new_decoder_architecture=False, multi_query=True)
    return c, _t().FalconModel(c)


@_arch("phi", "Phi-like (2 layers, partial rotary, parallel MLP)", ("ids", False))
def _phi() -> tuple[Any, Any]:
    c = _t().PhiConfig(num_hidden_layers=2, hidden_size=512, intermediate_size=2048,
                       num_attention_heads=8)
    return c, _t().PhiModel(c)


@_arch("mistral", "Mistral-like (2 layers, GQA 8/2, sliding window 32)", ("ids", False))
def _mistral() -> tuple[Any, Any]:
    c = _t().MistralConfig(num_hidden_layers=2, hidden_size=512, intermediate_size=1408,
                           num_attention_heads=8, num_key_value_heads=2, sliding_window=32)
    return c, _t().MistralModel(c)


@_arch("gemma", "Gemma-like (2 layers, multi-query, GELU-tanh gate)", ("ids", False))
def _gemma() -> tuple[Any, Any]:
    c = _t().GemmaConfig(num_hidden_layers=2, hidden_size=512, intermediate_size=1408,
                         num_attention_heads=8, num_key_value_heads=1, head_dim=64)
    return c, _t().GemmaModel(c)


@_arch("gptneox", "GPT-NeoX-like (2 layers, parallel residual)", ("ids", False))
def _gptneox() -> tuple[Any, Any]:
    c = _t().GPTNeoXConfig(num_hidden_layers=2, hidden_size=512, num_attention_heads=8,
                           intermediate_size=2048)
    return c, _t().GPTNeoXModel(c)


@_arch("opt", "OPT-like (2 layers, learned positions)", ("ids", True))
def _opt() -> tuple[Any, Any]:
    c = _t().OPTConfig(num_hidden_layers=2, hidden_size=512, ffn_dim=2048,
                       num_attention_heads=8, word_embed_proj_dim=512)
    return c, _t().OPTModel(c)


@_arch("bart", "BART encoder-decoder (2 + 2 layers, d_model 256)", ("ids+decoder",))
def _bart() -> tuple[Any, Any]:
    c = _t().BartConfig(encoder_layers=2, decoder_layers=2, d_model=256, encoder_ffn_dim=1024,
                        decoder_ffn_dim=1024, encoder_attention_heads=4,
                        decoder_attention_heads=4)
    return c, _t().BartModel(c)


@_arch("clipvision", "CLIP vision encoder (2 layers, 224x224)", ("pixels", 224))
def _clipvision() -> tuple[Any, Any]:
    c = _t().CLIPVisionConfig(num_hidden_layers=2)
    return c, _t().CLIPVisionModel(c)


@_arch("deit", "DeiT (2 layers, distillation token)", ("pixels", 224))
def _deit() -> tuple[Any, Any]:
    c = _t().DeiTConfig(num_hidden_layers=2)
    return c, _t().DeiTModel(c, add_pooling_layer=False)


@_arch("beit", "BEiT (2 layers, relative position bias)", ("pixels", 224))
def _beit() -> tuple[Any, Any]:
    c = _t().BeitConfig(num_hidden_layers=2)
    return c, _t().BeitModel(c, add_pooling_layer=False)


@_arch("levit", "LeViT (attention with BatchNorm, 224x224)", ("pixels", 224))
def _levit() -> tuple[Any, Any]:
    c = _t().LevitConfig()
    return c, _t().LevitModel(c)


@_arch("mobilevit", "MobileViT-small (256x256)", ("pixels", 256))
def _mobilevit() -> tuple[Any, Any]:
    c = _t().MobileViTConfig()
    return c, _t().MobileViTModel(c)


@_arch("segformer", "SegFormer-b0 encoder (224x224)", ("pixels", 224))
def _segformer() -> tuple[Any, Any]:
    c = _t().SegformerConfig()
    return c, _t().SegformerModel(c)


@_arch("poolformer", "PoolFormer-s12 (224x224)", ("pixels", 224))
def _poolformer() -> tuple[Any, Any]:
    c = _t().PoolFormerConfig()
    return c, _t().PoolFormerModel(c)


@_arch("mobilenetv2", "MobileNetV2 (224x224)", ("pixels", 224))
def _mobilenetv2() -> tuple[Any, Any]:
    c = _t().MobileNetV2Config()
    return c, _t().MobileNetV2Model(c)


@_arch("efficientnet", "EfficientNet-B7 config (224x224)", ("pixels", 224))
def _efficientnet() -> tuple[Any, Any]:
    c = _t().EfficientNetConfig()
    return c, _t().EfficientNetModel(c)


@_arch("regnet", "RegNet (224x224)", ("pixels", 224))
def _regnet() -> tuple[Any, Any]:
    c = _t().RegNetConfig()
    return c, _t().RegNetModel(c)


@_arch("wav2vec2", "Wav2Vec2 (2 layers, hidden 384, 1 s of audio)", ("audio", 16000))
def _wav2vec2() -> tuple[Any, Any]:
    c = _t().Wav2Vec2Config(num_hidden_layers=2, hidden_size=384, num_attention_heads=6,
                            intermediate_size=1536)
    return c, _t().Wav2Vec2Model(c)
