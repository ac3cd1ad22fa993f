"""Models shipped with fxprop, for the demo, the tests and the benchmarks (no downloads): the small
models of `models` (each `*_example()` returns ``(model, example_inputs)``), and `llama_70b`, a
Llama-3-70B-shaped decoder estimated on meta parameters (``python -m fxprop.examples.llama_70b``)."""
from .models import (GPT, BasicBlock, Block, GPTConfig, LSTMTagger, Llama, LlamaConfig, MLP, ResNet, cnn_example,
                     gpt_example, llama_on_meta, lstm_example, mlp_example)

__all__ = ["GPT", "BasicBlock", "Block", "GPTConfig", "LSTMTagger", "Llama", "LlamaConfig", "MLP", "ResNet",
           "cnn_example", "gpt_example", "llama_on_meta", "lstm_example", "mlp_example"]
