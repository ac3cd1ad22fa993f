"""Corpus runs (``"model/trace"``) known not to pass, each with the analysed reason.

A reason starts with its verdict:

- ``"fxprop bug: ..."``: fxprop's annotation is wrong or it fails where real execution works;
  tests/test_corpus.py marks the run ``xfail(strict=True)``, so fixing the bug fails the suite
  until the entry is removed.
- ``"torch.export cannot trace it: ..."``, ``"torch.fx cannot trace it: ..."``,
  ``"dynamo cannot trace it: ..."``, ``"real CPU execution itself fails: ..."``: torch or
  transformers, not fxprop; the run is skipped with the reason.

tools/corpus_sweep.py reports every run whose outcome disagrees with this list.
"""
from __future__ import annotations

FXPROP_BUG = "fxprop bug: "

# torch.fx.symbolic_trace cannot trace transformers models: they branch on tensor values and
# sizes, iterate over proxies and call untraceable helpers (transformers 5 removed its own
# HFTracer, transformers.utils.fx). The error each model stops at is quoted.
_FX = "torch.fx cannot trace it: "

KNOWN_FAILURES: dict[str, str] = {
    # --- fxprop's bugs (xfail strict): none open. Fixed: bloom/dynamo (autograd_function_apply,
    # tests/test_higher_order.py) and yolos/dynamo (a view's strides in a symbolic propagation,
    # tests/test_symbolic.py).

    # --- torch cannot trace it (skipped) -----------------------------------------------------
    "deberta/dynamo": ("dynamo cannot trace it: torch._dynamo.export raises InternalTorchDynamoError: "
                       "PendingUnbackedSymbolNotFound: Pending unbacked symbols {u4} not in returned outputs "
                       "FakeTensor(..., size=(1, 1, s70, s70), dtype=torch.int64); "
                       "deberta/export and deberta/module pass."),
    "segformer/dynamo": ("dynamo cannot trace it: torch._dynamo.export raises Unsupported: Unsupported context "
                         "manager; segformer/export and segformer/module pass."),

    # --- torch.fx.symbolic_trace (skipped) ----------------------------------------------------
    'gpt2/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/models/gpt2/modeling_gpt2.py:578 `if attention_mask is not None and attention_mask.ndim < 4:`)',
    'gpt_neo/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'gptj/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'gpt_neox/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'gpt_bigcode/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'llama/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'mistral/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'mixtral/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'qwen2/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'qwen2_moe/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'qwen3/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'qwen3_moe/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'phi/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'phi3/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'gemma/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'gemma2/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'gemma3_text/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'falcon/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'falcon_alibi/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'bloom/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'opt/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'codegen/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'stablelm/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'olmo/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'olmo2/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'starcoder2/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'cohere/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'granite/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'mpt/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'xglm/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'biogpt/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'deepseek_v3/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'bert/fx': _FX + 'TypeError: slice indices must be integers or None or have an __index__ method (at transformers/models/bert/modeling_bert.py:84 `position_ids = self.position_ids[:, past_key_values_length : seq_length + past_key_values_length]`)',
    'roberta/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'xlm_roberta/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'camembert/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'distilbert/fx': _FX + 'TypeError: slice indices must be integers or None or have an __index__ method (at transformers/models/distilbert/modeling_distilbert.py:107 `position_ids = self.position_ids[:, :seq_length]`)',
    'albert/fx': _FX + 'TypeError: slice indices must be integers or None or have an __index__ method (at transformers/models/albert/modeling_albert.py:82 `position_ids = self.position_ids[:, :seq_length]`)',
    'electra/fx': _FX + 'TypeError: slice indices must be integers or None or have an __index__ method (at transformers/models/electra/modeling_electra.py:89 `position_ids = self.position_ids[:, past_key_values_length : seq_length + past_key_values_length]`)',
    'deberta/fx': _FX + 'TypeError: slice indices must be integers or None or have an __index__ method (at transformers/models/deberta/modeling_deberta.py:377 `position_ids = self.position_ids[:, :seq_length]`)',
    'deberta_v2/fx': _FX + 'TypeError: slice indices must be integers or None or have an __index__ method (at transformers/models/deberta_v2/modeling_deberta_v2.py:521 `position_ids = self.position_ids[:, :seq_length]`)',
    'mpnet/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'modernbert/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'funnel/fx': _FX + "TypeError: 'Proxy' object cannot be interpreted as an integer (at transformers/models/funnel/modeling_funnel.py:152 `pos = list(range(seq_len))`)",
    'bert_mlm/fx': _FX + 'TypeError: slice indices must be integers or None or have an __index__ method (at transformers/models/bert/modeling_bert.py:84 `position_ids = self.position_ids[:, past_key_values_length : seq_length + past_key_values_length]`)',
    't5/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'mt5/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'bart/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'mbart/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'pegasus/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'marian/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'blenderbot/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/masking_utils.py:845 `if attention_mask is not None and attention_mask.ndim == 2:`)',
    'm2m_100/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/models/m2m_100/modeling_m2m_100.py:144 `if not (is_torchdynamo_compiling() and torch.is_tensor(max_pos)) and max_pos > self.weights.size(0):`)',
    'vit/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/models/vit/modeling_vit.py:370 `if pixel_values.dtype != expected_dtype:`)',
    'deit/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/models/deit/modeling_deit.py:381 `if pixel_values.dtype != expected_dtype:`)',
    'beit/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/models/beit/modeling_beit.py:85 `if num_channels != self.num_channels:`)',
    'dinov2/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/models/dinov2/modeling_dinov2.py:62 `if num_channels != self.num_channels:`)',
    'convnext/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/models/convnext/modeling_convnext.py:80 `if num_channels != self.num_channels:`)',
    'resnet/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/models/resnet/modeling_resnet.py:87 `if num_channels != self.num_channels:`)',
    'regnet/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/models/regnet/modeling_regnet.py:80 `if num_channels != self.num_channels:`)',
    'mobilenet_v2/fx': _FX + "TypeError: int() argument must be a string, a bytes-like object or a real number, not 'Proxy' (at transformers/models/mobilenet_v2/modeling_mobilenet_v2.py:56 `in_height = int(features.shape[-2])`)",
    'swin/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/models/swin/modeling_swin.py:269 `if width % self.patch_size[1] != 0:`)',
    'segformer/fx': _FX + 'TraceError: Proxy object cannot be iterated. This can be attempted when the Proxy is used in a loop or as a *args or **kwa (at transformers/models/segformer/modeling_segformer.py:173 `hidden_shape = (*input_shape, -1, self.head_dim)`)',
    'detr/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/models/resnet/modeling_resnet.py:87 `if num_channels != self.num_channels:`)',
    'conditional_detr/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/models/resnet/modeling_resnet.py:87 `if num_channels != self.num_channels:`)',
    'yolos/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/models/yolos/modeling_yolos.py:211 `if num_channels != self.num_channels:`)',
    'mamba/fx': _FX + 'NameError: module is not installed as a submodule (at transformers/models/mamba/modeling_mamba.py:99 `out = ACT2FN[activation](out)`)',
    'mamba2/fx': _FX + 'NameError: module is not installed as a submodule (at transformers/models/mamba2/modeling_mamba2.py:165 `out = ACT2FN[activation](out)`)',
    'falcon_mamba/fx': _FX + 'NameError: module is not installed as a submodule (at transformers/models/falcon_mamba/modeling_falcon_mamba.py:114 `out = ACT2FN[activation](out)`)',
    'whisper/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/models/whisper/modeling_whisper.py:610 `if input_features.shape[-1] != expected_seq_length:`)',
    'wav2vec2/fx': _FX + 'TraceError: Proxy object cannot be iterated. This can be attempted when the Proxy is used in a loop or as a *args or **kwa (at transformers/models/wav2vec2/modeling_wav2vec2.py:523 `hidden_shape = (*input_shape, -1, self.head_dim)`)',
    'hubert/fx': _FX + 'TraceError: Proxy object cannot be iterated. This can be attempted when the Proxy is used in a loop or as a *args or **kwa (at transformers/models/hubert/modeling_hubert.py:318 `hidden_shape = (*input_shape, -1, self.head_dim)`)',
    'clip/fx': _FX + 'TraceError: symbolically traced variables cannot be used as inputs to control flow (at transformers/models/clip/modeling_clip.py:204 `if not interpolate_pos_encoding and (height != self.image_size or width != self.image_size):`)',
}


def key(model: str, trace: str) -> str:
    return f"{model}/{trace}"


def is_fxprop_bug(reason: str) -> bool:
    return reason.startswith(FXPROP_BUG)
