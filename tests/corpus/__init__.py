"""Real transformers models from tiny configs, for comparing fxprop with real execution."""
