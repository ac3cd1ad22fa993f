"""Graphs of sharded programs on a mesh this host does not have: simulated meshes (`meshes`),
DTensor values, their placements, redistributions and collectives per node (`dtensors`), FSDP2's
forward hooks emulated from its own state (`fsdp`), and a tensor/sequence-parallel plan with
FSDP-style parameter sharding for Llama-style models (`parallel`)."""
