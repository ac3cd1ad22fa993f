"""A propagation that replays an earlier walk of its graph (`fxprop.memo.replay`), or walks it and
keeps the walk for the next call with the same key."""
from __future__ import annotations

import copy
from typing import Any

import torch

from ..devices import default_device_if_set
from ..errors import InternalError
from ..memo import replay
from ..memo.backend_flags import environment
from ..resolve.registry import generation as registry_generation


def run_or_replay(propagation: Any, inputs: list) -> Any:
    """Walk the graph on ``inputs`` (the call's internal values), or replay an earlier walk whose key
    is this call's; with ``cache="verify"`` the graph is walked and compared with the replay.

    A graph is keyed and kept from its second sighting on (a graph of as many nodes and inputs
    propagated before, since the cache was last cleared): a graph seen once costs nothing more than
    its walk, and only graphs that come back take room in the cache."""
    memo = propagation.options.memo
    seen = memo is not None and memo.seen_before((len(propagation.gm.graph.nodes), len(inputs)))
    call = graph_call(propagation, inputs) if seen else None
    entry = memo.graph(call.key) if call is not None else None
    if entry is not None and not propagation.options.verify:
        return _replay(propagation, call, entry)
    propagation.recordings = {} if call is not None else None
    output = propagation.run(lambda: propagation.walk(propagation.gm, inputs))
    if call is not None:
        _keep_or_compare(propagation, call, entry)
    return output


def graph_call(propagation: Any, inputs: list) -> replay.GraphCall | None:
    options = propagation.options
    if options.memo is None or propagation.sharding is not None or propagation.symbols.active:
        return None
    context = (environment(), default_device_if_set(), registry_generation(), options.param_device,
               options.fallback_limit_bytes, torch.is_inference_mode_enabled())
    return replay.graph_call(propagation.gm, inputs, propagation.state, propagation.session.real_values, context)


def _replay(propagation: Any, call: replay.GraphCall, entry: replay.GraphEntry) -> Any:
    progress = propagation.options.progress
    total = len(propagation.gm.graph.nodes)
    make_fake, staged = propagation.make_fake, propagation.staged
    build, fresh_tensor_meta = replay.build, replay.fresh_tensor_meta
    storages: dict = {}  # this replay's own meta storages, by the snapshot's storage
    for index, (node, (value, tensor_meta, value_type, provenance)) in enumerate(zip(call.nodes, entry.nodes)):
        if progress is not None:
            progress(index, total)
        staged[node] = (build(value, make_fake, storages), fresh_tensor_meta(tensor_meta), value_type, provenance)
    if progress is not None:
        progress(total, total)
    if entry.known_inputs is not None:  # by position: this graph's placeholders may be named otherwise
        propagation.known_inputs = {call.nodes[position].name: real.clone()
                                    for position, real in entry.known_inputs.items()}
    propagation.commit()
    propagation.gm.meta["fxprop"].update(copy.deepcopy(entry.summary))
    return staged[call.nodes[-1]][0]


def _keep_or_compare(propagation: Any, call: replay.GraphCall, entry: replay.GraphEntry | None) -> None:
    """Keep this walk for replay; or, verifying, compare it with the replay kept before."""
    if propagation.symbols.active or len(propagation.staged) != len(call.nodes):
        return  # symbols name this call's ShapeEnv; a subgraph's nodes were staged as well
    recorded = replay.replayable_run(list(call.nodes), propagation.recordings)
    if recorded is None:
        return
    if entry is None:
        known = propagation.known_inputs
        known_inputs = None
        if known is not None:
            known_inputs = {position: known[node.name].clone() for position, node in enumerate(call.nodes)
                            if node.op == "placeholder" and node.name in known}
        summary = copy.deepcopy(propagation.symbols.summary())
        propagation.options.memo.keep_graph(call.key, replay.GraphEntry(replay.kept(recorded), known_inputs, summary))
        return
    differing = replay.differences(entry.nodes, replay.kept(recorded))
    if not differing:  # the entry holds what the walk staged: a replay must build that too
        differing = replay.built_differences(entry.nodes, [propagation.staged[node][0] for node in call.nodes],
                                             propagation.make_fake)
    if differing:
        names = ", ".join(f"%{call.nodes[i].name}" for i in differing[:5] if i < len(call.nodes))
        raise InternalError(f"the graph replay differs from a walk of the graph at {len(differing)} node(s): {names}")
