"""The model `fxprop estimate` builds: a transformers config, and its causal LM on the meta device.

The config comes from a ``config.json`` (or a folder holding one), a model type
(``AutoConfig.for_model``), or a Hugging Face Hub id (``AutoConfig.from_pretrained``, which
needs the network); ``KEY=VALUE`` overrides apply on top of any of them. Values are python
literals read with `ast.literal_eval` (never evaluated as code); a bare word is a string
(``hidden_act=silu``). An override must name a field of the config, or a key the config turns
into one (llama's ``rope_theta`` becomes ``rope_parameters``): a misspelt key is refused, not
stored and ignored as transformers would.

The model is ``AutoModelForCausalLM.from_config`` under ``torch.device("meta")``: no weights
are read or downloaded, and nothing is allocated. transformers is imported only here, when
the command runs.

>>> parse_override("rope_scaling={'factor': 8.0}")
('rope_scaling', {'factor': 8.0})
>>> parse_override("hidden_act=silu")
('hidden_act', 'silu')
"""
from __future__ import annotations

import ast
import difflib
import json
import os
import re
from typing import Any

import torch

from .loading import LoadError, UsageError

TRANSFORMERS_HINT = "fxprop estimate needs transformers, which is not installed: pip install transformers"

_BARE_WORD = re.compile(r"[A-Za-z_][\w.\-]*\Z")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise LoadError(TRANSFORMERS_HINT) from None
    return transformers


def parse_override(text: str) -> tuple[str, Any]:
    """``"KEY=VALUE"`` -> ``(key, value)``, the value a python literal or a bare word."""
    key, equals, raw = text.partition("=")
    if not equals or not key.isidentifier():
        raise UsageError(f"bad override {text!r}: expected KEY=VALUE, such as hidden_size=8192")
    try:
        return key, ast.literal_eval(raw)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        if _BARE_WORD.match(raw):
            return key, raw
    raise UsageError(f"bad override {text!r}: the value must be a python literal (a number, a quoted string, "
                     "True/False/None, a list or dict of them) or a bare word such as silu")


def load_config(source: str, overrides: dict[str, Any]) -> Any:
    """The config named by ``source`` (a path, a model type or a Hub id), with ``overrides`` applied."""
    transformers = _transformers()
    base = _base_settings(source, transformers)
    model_type = base.pop("model_type", None)
    if not model_type:
        raise LoadError(f"{source}: the config has no model_type, so transformers cannot tell which model it is")
    plain = _config(transformers, model_type, base, source)
    unknown = [key for key in overrides if not _is_setting(transformers, model_type, base, plain, key, overrides[key])]
    if unknown:
        fields = sorted(plain.to_dict())
        hints = "; ".join(f"{key!r}" + _did_you_mean(key, fields) for key in unknown)
        raise UsageError(f"{model_type} configs have no field {hints}")
    return _config(transformers, model_type, {**base, **overrides}, source)


def _base_settings(source: str, transformers: Any) -> dict[str, Any]:
    """The settings before overrides: the file's, the Hub's, or none (a model type's defaults)."""
    path = os.path.expanduser(source)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if os.path.isfile(path):
        source = path
        try:
            with open(source, encoding="utf-8") as handle:
                settings = json.load(handle)
        except (OSError, ValueError) as error:
            raise LoadError(f"{source}: cannot read it as JSON: {error}") from None
        if not isinstance(settings, dict):
            raise LoadError(f"{source}: expected a JSON object of config fields, got {type(settings).__name__}")
        return settings
    folder = os.path.dirname(path)
    if path.endswith(".json") or source.startswith((".", "/", "~")) or folder and os.path.isdir(folder):
        raise UsageError(f"{path}: no such file")
    if source in transformers.CONFIG_MAPPING:
        return {"model_type": source}
    if "/" in source:
        return _from_hub(source, transformers)
    raise UsageError(f"unknown model type {source!r}{_did_you_mean(source, list(transformers.CONFIG_MAPPING))}; "
                     "give a model type (llama, gpt2, ...), a config.json path, or a Hub id such as "
                     "meta-llama/Meta-Llama-3-70B")


def _from_hub(model_id: str, transformers: Any) -> dict[str, Any]:
    try:
        return transformers.AutoConfig.from_pretrained(model_id).to_dict()
    except OSError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0") or "connect" in first
        why = " (offline: HF_HUB_OFFLINE is set or the Hub cannot be reached)" if offline else ""
        raise LoadError(f"cannot fetch the config of {model_id!r} from the Hugging Face Hub{why}: {first}; "
                        "give a config.json path, or a model type with KEY=VALUE overrides") from None
    except Exception as error:  # a config transformers cannot read (custom code, an unknown model type)
        raise LoadError(f"reading the config of {model_id!r} failed: {type(error).__name__}: {error}") from None


def _config(transformers: Any, model_type: str, settings: dict[str, Any], source: str) -> Any:
    try:
        return transformers.AutoConfig.for_model(model_type, **settings)
    except ValueError as error:
        if model_type not in transformers.CONFIG_MAPPING:
            raise UsageError(f"{source}: unknown model type {model_type!r}") from None
        raise UsageError(f"{model_type} config refused the settings: {error}") from None
    except (TypeError, KeyError, AttributeError, *_strict_config_errors()) as error:
        raise UsageError(f"{model_type} config refused the settings: {type(error).__name__}: {error}") from None


def _strict_config_errors() -> tuple[type[Exception], ...]:
    """The errors transformers' strict config dataclasses raise on a value they refuse (huggingface_hub's)."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ()
    return (StrictDataclassError,)


def _is_setting(transformers: Any, model_type: str, base: dict, plain: Any, key: str, value: Any) -> bool:
    """A field of the config, or a key that changes one (not merely stored under its own name)."""
    if hasattr(plain, key):
        return True
    changed = _config(transformers, model_type, {**base, key: value}, model_type).to_dict()
    changed.pop(key, None)
    return changed != plain.to_dict()


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=3)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def causal_lm_on_meta(config: Any, dtype: torch.dtype, train: bool, activation_checkpointing: bool) -> Any:
    """``AutoModelForCausalLM.from_config(config)`` with ``dtype`` parameters on the meta device, in
    training or eval mode, with activation checkpointing on request.

    ``use_cache`` stays as the config has it, as in a real run: with a cache (the default) a
    causal LM does not look for packed sequences in its position ids, which reads their values."""
    transformers = _transformers()
    try:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    except ValueError as error:
        if "Unrecognized configuration class" in str(error):
            raise UsageError(f"{config.model_type} has no causal language model in transformers "
                             "(AutoModelForCausalLM); fxprop estimate builds causal LMs") from None
        raise LoadError(f"building {config.model_type} failed: {error}") from None
    except Exception as error:
        raise LoadError(f"building {config.model_type} failed: {type(error).__name__}: {error}") from error
    model.train(train)
    if activation_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise UsageError(f"{type(model).__name__} does not support activation checkpointing "
                             "(supports_gradient_checkpointing is False)")
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model
