"""A corpus of real `transformers` architectures, each built from a tiny config in code.

Nothing is downloaded: every model is ``AutoModel*.from_config`` of an ``AutoConfig.for_model``
with a handful of overrides (hidden 32, 2 layers, 4 heads, vocab 256, sequence 8), randomly
initialized under a fixed seed and put in eval mode. Each `Case` builds ``(model, inputs)``:
``inputs`` is an ordered dict of the tensors the model is called with (by keyword), the way a
pipeline calls it (token ids plus attention mask for text, pixel values for vision, raw
audio or log-mel features for speech).

`CASES` maps a name to its `Case`; `build(name)` gives a fresh ``(model, inputs)``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch

BATCH, SEQ, VOCAB = 2, 8, 256

# The overrides most decoder/encoder configs accept (names differ per family; unknown keys
# are simply stored on the config by PretrainedConfig, so extra keys are harmless).
TEXT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
GQA = dict(TEXT, num_key_value_heads=2)


@dataclass
class Case:
    name: str
    family: str                      # decoder / encoder / encoder-decoder / vision / audio / multimodal / state-space
    model_type: str                  # the transformers model_type (AutoConfig.for_model)
    head: str                        # an Auto class (AutoModelForCausalLM, ...) or a concrete model class
    config: dict[str, Any]
    inputs: Callable[[Any], dict[str, torch.Tensor]]
    ci: bool = False                 # part of tests/test_corpus.py's CI slice
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def build(self, seed: int = 0) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
        import transformers
        config = transformers.AutoConfig.for_model(self.model_type, **self.config)
        if hasattr(config, "use_cache"):
            config.use_cache = False
        torch.manual_seed(seed)
        cls = getattr(transformers, self.head)
        model = (cls.from_config(config, **self.extra) if self.head.startswith("Auto") else cls(config)).eval()
        generator = torch.Generator().manual_seed(seed)
        return model, self.inputs(config, generator)


# ---------------------------------------------------------------------------------------------
# Inputs

def _ids(config, generator=None, *, low=3, seq=SEQ):
    vocab = getattr(config, "vocab_size", VOCAB)
    return torch.randint(low, vocab, (BATCH, seq), generator=generator)


def _mask(seq=SEQ):
    mask = torch.ones(BATCH, seq, dtype=torch.long)
    mask[1, :2] = 0   # the second sequence left-padded by two tokens, as a batched pipeline pads
    return mask


def text(config, generator=None):
    return {"input_ids": _ids(config, generator), "attention_mask": _mask()}


def text_right_pad(config, generator=None):
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, -2:] = 0
    return {"input_ids": _ids(config, generator), "attention_mask": mask}


def ids_only(config, generator=None):
    return {"input_ids": _ids(config, generator)}


def seq2seq(config, generator=None):
    return {"input_ids": _ids(config, generator), "attention_mask": text_right_pad(config)["attention_mask"],
            "decoder_input_ids": _ids(config, generator, seq=SEQ // 2)}


def pixels(size=32, channels=3):
    def make(config, generator=None):
        return {"pixel_values": torch.randn(BATCH, channels, size, size, generator=generator)}
    return make


def audio_raw(samples=1600):
    def make(config, generator=None):
        return {"input_values": torch.randn(BATCH, samples, generator=generator)}
    return make


def whisper_inputs(config, generator=None):
    frames = 2 * config.max_source_positions
    return {"input_features": torch.randn(BATCH, config.num_mel_bins, frames, generator=generator),
            "decoder_input_ids": _ids(config, generator, seq=SEQ // 2)}


def clip_inputs(config, generator=None):
    vision = config.vision_config
    return {"input_ids": _ids(config.text_config, generator), "attention_mask": text_right_pad(config)["attention_mask"],
            "pixel_values": torch.randn(BATCH, 3, vision.image_size, vision.image_size, generator=generator)}


# ---------------------------------------------------------------------------------------------
# The corpus

_CASES: list[Case] = []


def case(name, family, model_type, head, config, inputs, **options):
    _CASES.append(Case(name, family, model_type, head, config, inputs, **options))


LM = "AutoModelForCausalLM"
SEQ2SEQ = "AutoModelForSeq2SeqLM"
BASE = "AutoModel"
IMAGE = "AutoModelForImageClassification"

# Decoder LMs -------------------------------------------------------------------------------
case("gpt2", "decoder", "gpt2", LM, dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64), text)
case("gpt_neo", "decoder", "gpt_neo", LM, dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4,
                                               attention_types=[[["global", "local"], 1]], window_size=4,
                                               max_position_embeddings=64), text)
case("gptj", "decoder", "gptj", LM, dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64), text)
case("gpt_neox", "decoder", "gpt_neox", LM, dict(TEXT, rotary_pct=0.5), text)
case("gpt_bigcode", "decoder", "gpt_bigcode", LM, dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                                       multi_query=True), text)
case("llama", "decoder", "llama", LM, GQA, text)
case("mistral", "decoder", "mistral", LM, dict(GQA, sliding_window=4), text)
case("mixtral", "decoder", "mixtral", LM, dict(GQA, num_local_experts=4, num_experts_per_tok=2), text,
     note="MoE: top-k routing, per-expert index gathers")
case("qwen2", "decoder", "qwen2", LM, GQA, text)
case("qwen2_moe", "decoder", "qwen2_moe", LM, dict(GQA, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                                   shared_expert_intermediate_size=32, decoder_sparse_step=1), text,
     note="MoE with a shared expert and a sigmoid gate")
case("qwen3", "decoder", "qwen3", LM, dict(GQA, head_dim=8), text)
case("qwen3_moe", "decoder", "qwen3_moe", LM, dict(GQA, head_dim=8, num_experts=4, num_experts_per_tok=2,
                                                   moe_intermediate_size=32, decoder_sparse_step=1), text)
case("phi", "decoder", "phi", LM, dict(TEXT, partial_rotary_factor=0.5), text)
case("phi3", "decoder", "phi3", LM, dict(GQA, pad_token_id=0), text)
case("gemma", "decoder", "gemma", LM, dict(GQA, head_dim=8), text)
case("gemma2", "decoder", "gemma2", LM, dict(GQA, head_dim=8, sliding_window=4), text)
case("gemma3_text", "decoder", "gemma3_text", LM, dict(GQA, head_dim=8, sliding_window=4), text)
case("falcon", "decoder", "falcon", LM, dict(TEXT, new_decoder_architecture=False, multi_query=True), text)
case("falcon_alibi", "decoder", "falcon", LM, dict(TEXT, new_decoder_architecture=False, multi_query=True, alibi=True),
     text, note="ALiBi instead of rotary")
case("bloom", "decoder", "bloom", LM, dict(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4), text,
     note="ALiBi positional bias")
case("opt", "decoder", "opt", LM, dict(TEXT, ffn_dim=64, word_embed_proj_dim=32), text)
case("codegen", "decoder", "codegen", LM, dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                                               n_positions=64, n_ctx=64), text)
case("stablelm", "decoder", "stablelm", LM, dict(GQA, partial_rotary_factor=0.25), text)
case("olmo", "decoder", "olmo", LM, GQA, text)
case("olmo2", "decoder", "olmo2", LM, GQA, text)
case("starcoder2", "decoder", "starcoder2", LM, dict(GQA, sliding_window=4), text)
case("cohere", "decoder", "cohere", LM, GQA, text)
case("granite", "decoder", "granite", LM, GQA, text)
case("mpt", "decoder", "mpt", LM, dict(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, max_seq_len=64,
                                       expansion_ratio=2), text, note="ALiBi")
case("xglm", "decoder", "xglm", LM, dict(vocab_size=VOCAB, d_model=32, num_layers=2, attention_heads=4, ffn_dim=64,
                                         max_position_embeddings=64), text)
case("biogpt", "decoder", "biogpt", LM, TEXT, text)
case("deepseek_v3", "decoder", "deepseek_v3", LM,
     dict(GQA, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=1,
          topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4,
          qk_nope_head_dim=4, v_head_dim=8, num_key_value_heads=4), text, note="MLA attention + grouped MoE")

# Encoders -----------------------------------------------------------------------------------
case("bert", "encoder", "bert", BASE, TEXT, text_right_pad)
case("roberta", "encoder", "roberta", BASE, dict(TEXT, pad_token_id=1), text_right_pad)
case("xlm_roberta", "encoder", "xlm-roberta", BASE, dict(TEXT, pad_token_id=1), text_right_pad)
case("camembert", "encoder", "camembert", BASE, dict(TEXT, pad_token_id=1), text_right_pad)
case("distilbert", "encoder", "distilbert", BASE, dict(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                                       max_position_embeddings=64), text_right_pad)
case("albert", "encoder", "albert", BASE, dict(TEXT, embedding_size=16), text_right_pad)
case("electra", "encoder", "electra", BASE, dict(TEXT, embedding_size=16), text_right_pad)
case("deberta", "encoder", "deberta", BASE, dict(TEXT, relative_attention=True, pos_att_type=["c2p", "p2c"]), text_right_pad)
case("deberta_v2", "encoder", "deberta-v2", BASE, dict(TEXT, relative_attention=True, position_buckets=8,
                                                       pos_att_type=["c2p", "p2c"]), text_right_pad)
case("mpnet", "encoder", "mpnet", BASE, dict(TEXT, pad_token_id=1), text_right_pad)
case("modernbert", "encoder", "modernbert", BASE, dict(TEXT, global_attn_every_n_layers=2, local_attention=4), text_right_pad)
case("funnel", "encoder", "funnel", "FunnelModel", dict(vocab_size=VOCAB, block_sizes=[1, 1], d_model=32, n_head=4, d_head=8,
                                               d_inner=64, num_decoder_layers=1), text_right_pad)
case("bert_mlm", "encoder", "bert", "AutoModelForMaskedLM", TEXT, text_right_pad, note="fill-mask head, tied weights")

# Encoder-decoders ---------------------------------------------------------------------------
S2S = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
           decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
           pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2)
T5 = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
          decoder_start_token_id=0)
case("t5", "encoder-decoder", "t5", SEQ2SEQ, T5, seq2seq, note="relative position bias")
case("mt5", "encoder-decoder", "mt5", SEQ2SEQ, dict(T5, feed_forward_proj="gated-gelu"), seq2seq)
case("bart", "encoder-decoder", "bart", SEQ2SEQ, S2S, seq2seq)
case("mbart", "encoder-decoder", "mbart", SEQ2SEQ, S2S, seq2seq)
case("pegasus", "encoder-decoder", "pegasus", SEQ2SEQ, S2S, seq2seq, note="sinusoidal positions")
case("marian", "encoder-decoder", "marian", SEQ2SEQ, dict(S2S, decoder_vocab_size=VOCAB), seq2seq)
case("blenderbot", "encoder-decoder", "blenderbot", SEQ2SEQ, S2S, seq2seq)
case("m2m_100", "encoder-decoder", "m2m_100", SEQ2SEQ, S2S, seq2seq)

# Vision ------------------------------------------------------------------------------------
VIT = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
           intermediate_size=64, num_labels=10)
case("vit", "vision", "vit", IMAGE, VIT, pixels(32))
case("deit", "vision", "deit", "DeiTForImageClassification", VIT, pixels(32))
case("beit", "vision", "beit", IMAGE, dict(VIT, use_relative_position_bias=True), pixels(32))
case("dinov2", "vision", "dinov2", BASE, dict(VIT, patch_size=8), pixels(32))
case("convnext", "vision", "convnext", IMAGE, dict(num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=10), pixels(32),
     note="channels-last layer norm, permutes")
case("resnet", "vision", "resnet", IMAGE, dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                               layer_type="basic", num_labels=10), pixels(32))
case("regnet", "vision", "regnet", IMAGE, dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=8,
                                               num_labels=10), pixels(32))
case("mobilenet_v2", "vision", "mobilenet_v2", IMAGE, dict(image_size=32, depth_multiplier=0.25, num_labels=10),
     pixels(32), note="depthwise convs, relu6")
case("swin", "vision", "swin", IMAGE, dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                           window_size=4, num_labels=10), pixels(32), note="shifted windows")
case("segformer", "vision", "segformer", "AutoModelForSemanticSegmentation",
     dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], num_attention_heads=[1, 2],
          patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2], decoder_hidden_size=16, num_labels=4), pixels(32))

DETR_BACKBONE = dict(model_type="resnet", embedding_size=8, hidden_sizes=[8, 8, 16, 16], depths=[1, 1, 1, 1],
                     layer_type="basic", out_features=["stage4"])
DETR = dict(backbone_config=DETR_BACKBONE, use_timm_backbone=False, use_pretrained_backbone=False, d_model=32,
            encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=8, num_labels=4)
case("detr", "vision", "detr", "DetrForObjectDetection", DETR, pixels(64),
     note="ResNet backbone, sine positions, object queries")
case("conditional_detr", "vision", "conditional_detr", "ConditionalDetrForObjectDetection", DETR, pixels(64))
case("yolos", "vision", "yolos", "YolosForObjectDetection", dict(VIT, image_size=[32, 32], num_detection_tokens=4, num_labels=4),
     pixels(32), note="ViT detector with detection tokens")

# State-space --------------------------------------------------------------------------------
case("mamba", "state-space", "mamba", LM, dict(vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2,
                                               expand=2, conv_kernel=4, pad_token_id=0), ids_only,
     note="selective scan (slow path on CPU), causal depthwise conv")
case("mamba2", "state-space", "mamba2", LM, dict(vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2,
                                                 expand=2, conv_kernel=4, num_heads=8, head_dim=8, n_groups=1,
                                                 chunk_size=4, pad_token_id=0), ids_only,
     note="chunked SSD scan")
case("falcon_mamba", "state-space", "falcon_mamba", LM, dict(vocab_size=VOCAB, hidden_size=32, state_size=8,
                                                             num_hidden_layers=2, expand=2, conv_kernel=4,
                                                             pad_token_id=0), ids_only)

# Audio -------------------------------------------------------------------------------------
case("whisper", "audio", "whisper", "WhisperForConditionalGeneration",
     dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
          decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=16,
          max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1),
     whisper_inputs)
case("wav2vec2", "audio", "wav2vec2", BASE,
     dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16),
          conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
          mask_time_prob=0.0), audio_raw(), note="conv feature extractor, weight-norm positional conv")
case("hubert", "audio", "hubert", BASE,
     dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16),
          conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
          mask_time_prob=0.0), audio_raw())

# Multimodal --------------------------------------------------------------------------------
case("clip", "multimodal", "clip", BASE,
     dict(text_config=dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=64),
          vision_config=dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=64), projection_dim=16), clip_inputs)

CASES: dict[str, Case] = {c.name: c for c in _CASES}
assert len(CASES) == len(_CASES), "duplicate case names"
# tests/test_corpus.py's CI slice: one model per mechanism, each a second or two per trace.
CI_SLICE = [
    "llama",      # GQA, rotary, SDPA with a padding mask
    "mistral",    # sliding-window mask
    "mixtral",    # MoE: top-k routing, per-expert gathers
    "qwen2_moe",  # MoE with a shared expert
    "bloom",      # ALiBi
    "bert",       # encoder, token types, absolute positions
    "t5",         # encoder-decoder, relative position buckets
    "bart",       # encoder-decoder, learned positions
    "vit",        # patch embedding
    "resnet",     # convs, batch norm (eval), pooling
    "swin",       # shifted windows: rolls, window partition views
    "detr",       # detector: ResNet backbone, sine positions, object queries, box head
    "mamba",      # state-space: selective scan, causal depthwise conv
    "whisper",    # audio encoder-decoder on log-mel features
    "wav2vec2",   # raw-audio conv feature extractor, weight-norm positional conv
    "clip",       # multimodal: text and vision towers, projections
]
for _name in CI_SLICE:
    CASES[_name].ci = True

# The traces tests/test_corpus.py's CI slice runs per model (default: export and module). dynamo
# is slow to trace (seconds per model), so it runs on a few; fx always fails on transformers
# models (tests/corpus/known_failures.py) and is listed once, skipped, to keep that visible.
CI_TRACES: dict[str, tuple[str, ...]] = {
    "llama": ("export", "module", "module_spec", "dynamo"),
    "bert": ("export", "module", "module_spec", "dynamo", "fx"),
    "bloom": ("export", "module", "dynamo"),   # dynamo keeps its autograd.Function as autograd_function_apply
    "vit": ("export", "module", "dynamo"),
}


def build(name: str, seed: int = 0) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    return CASES[name].build(seed)

# tests/test_corpus.py's training slice (tests/corpus/training.py): AOT's forward and backward
# graphs, static and dynamic, and the make_fx joint graph, of models in train mode. Dynamic
# compiles cost seconds of dynamo's own symbolic reasoning (swin's take minutes), so a few run.
TRAINING_SLICE: dict[str, tuple[str, ...]] = {
    "llama": ("aot", "aot_dynamic", "joint"),    # decoder: GQA, rotary, SDPA, RMSNorm
    "resnet": ("aot", "aot_dynamic", "joint"),   # convs, batch norm in training, pooling
    "bert": ("aot", "joint"),                    # encoder: dropout, layer norm, GELU
    "t5": ("aot", "joint"),                      # encoder-decoder: relative position buckets
    "mixtral": ("joint",),                       # eager MoE: _grouped_mm, routing values burned into the trace
}
