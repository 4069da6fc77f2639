"""The provider interface: where on-demand nodes come from, and what every provider shares."""

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from services.placement.policy import InstanceType

REGISTER_PATIENCE_S = 120  # a provisioned node that has not registered this long after boot is given back


def boot_allowance_s(instance: InstanceType) -> float:
    """The longest placement waits for a node of this type to register once it is rented (then gives it back)."""
    return instance.startup_delay_s + REGISTER_PATIENCE_S


class Unavailable(Exception):
    """The cloud has no capacity (or quota) for this instance type now: placement should try another."""

    def __init__(self, instance_type: str, reason: str) -> None:
        super().__init__(f"{instance_type} is unavailable: {reason}")
        self.instance_type = instance_type
        self.reason = reason


@dataclass(frozen=True)
class Orphan:
    """A rented machine of this cluster that no node record owns (reconcile gives it back)."""

    instance_id: str
    node_id: str
    instance_type: str
    job_id: str | None
    launched_at: datetime


class Provider(Protocol):
    name: str

    async def provision(self, node_id: str, instance: InstanceType) -> int | None:
        """Create the node (returns a handle to keep, e.g. a pid); it registers itself when it is up."""

    async def release(self, node_id: str, handle: int | None) -> None:
        """Give the node back."""


def node_entry(node_id: str, instance: InstanceType) -> str:
    """The cluster-file entry of a provisioned node."""
    return (
        f'[[nodes]]\nid = "{node_id}"\nkind = "on_demand"\ncpu_count = {instance.cpu}\n'
        f"memory_gb = {instance.memory_gb}\nprice_per_hour = {instance.price_per_hour}\n"
        f'gpus = [{{ model = "{instance.gpu_model}", memory_gb = {instance.gpu_memory_gb}, '
        f"tflops = {instance.tflops}, count = {instance.gpus} }}]\n"
        f'labels = {{ instance_type = "{instance.name}", provisioned_by = "trainmaster" }}\n'
    )
