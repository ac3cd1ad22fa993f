"""The engine: one `propagate` call from the user's inputs to every node's committed metadata.

`propagation` walks the graph (one handler per node kind, as `torch.fx.Interpreter`) and
stages, then commits, what each node becomes; `dispatch` resolves each aten op a call reaches;
`session` is the state of the call in progress that rules may consult; `inputs` turns what the
user passed (tensors, fakes, `TensorSpec`s) into internal meta tensors; `exported` reads and
updates ExportedPrograms; `module_state` shadows modules so that their state is never
materialized or mutated; `metadata` writes the ``node.meta`` formats torch passes read;
`known_values` and `source` keep the values fxprop knows and the user's source lines; `blame`
decides whose fault an exception is.
"""
