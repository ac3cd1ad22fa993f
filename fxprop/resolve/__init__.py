"""Which rule handles a call: the table of hand-written rules (`registry`), the one lookup order
the engine and every tool follow (`order`), and its public face `fxprop.lookup` (`lookup`, which
propagates a one-node graph from `call_graphs` when given arguments)."""
