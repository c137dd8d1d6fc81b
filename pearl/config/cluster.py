"""``[cluster]`` and its ``[[cluster.nodes]]``: the GPUs PEARL manages and where they are."""

from __future__ import annotations

from dataclasses import dataclass

from pearl.config.gpus import GpuList


@dataclass(frozen=True)
class NodeConfig:
    """``[[cluster.nodes]]``: one Ray node and the table's GPUs it holds (launcher = "ray").
    Exactly one of ``address``, ``node_id`` or ``label`` names it."""

    gpus: GpuList = ()
    """The table's GPUs this node holds."""
    address: str = ""
    """The node's IP as Ray reports it."""
    node_id: str = ""
    """Ray's hex id of the node."""
    label: str = ""
    """``KEY=VALUE``: a label the node was started with (``ray start --labels``)."""

    def names(self) -> str:
        return self.address or self.node_id or self.label


@dataclass(frozen=True)
class ClusterConfig:
    """``[cluster]``: the GPUs PEARL manages and how they are grouped into workers."""

    gpu: str = "H800"
    """GPU model, a name in the catalog (sets the roofline and memory)."""
    tp: int = 2
    """GPUs per worker (tensor parallelism)."""
    training_gpus: GpuList = tuple(range(0, 16))
    """GPUs the trainer holds; lent to rollouts between training steps."""
    reserved_gpus: GpuList = tuple(range(16, 20))
    """GPUs that serve rollouts all the time."""
    preemptible_gpus: GpuList = tuple(range(20, 32))
    """GPUs that may come and go (spot instances)."""
    initial_preemptible: GpuList = ()
    """Preemptible GPUs present at start."""
    mem_fraction: float = 0.9
    """Share of a worker's HBM for weights and KV cache (sets H_max)."""
    nodes: tuple[NodeConfig, ...] = ()
    """Ray nodes and their GPUs; none: each node names its own (the ``ray.gpus_label`` label)."""


__all__ = ["ClusterConfig", "NodeConfig"]
