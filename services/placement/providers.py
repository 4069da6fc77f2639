"""Where on-demand nodes come from. `local-process` starts an agent process on this machine that registers as an
on-demand node of the requested instance type once its start-up delay has passed (for `make run` and tests);
a cloud provider implements the same two calls with the cloud's API."""
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Protocol

from services.placement.policy import InstanceType

log = logging.getLogger(__name__)


class Provider(Protocol):
    name: str

    async def provision(self, node_id: str, instance: InstanceType) -> int | None:
        """Create the node (returns a handle to keep, e.g. a pid); it registers itself when it is up."""

    async def release(self, node_id: str, handle: int | None) -> None:
        """Give the node back."""


def node_entry(node_id: str, instance: InstanceType) -> str:
    """The cluster-file entry of a provisioned node."""
    return (f'[[nodes]]\nid = "{node_id}"\nkind = "on_demand"\ncpu_count = {instance.cpu}\n'
            f'memory_gb = {instance.memory_gb}\nprice_per_hour = {instance.price_per_hour}\n'
            f'gpus = [{{ model = "{instance.gpu_model}", memory_gb = {instance.gpu_memory_gb}, '
            f'tflops = {instance.tflops}, count = {instance.gpus} }}]\n'
            f'labels = {{ instance_type = "{instance.name}", provisioned_by = "trainmaster" }}\n')


class LocalProcessProvider:
    name = "local-process"

    def __init__(self, *, data_dir: Path, env: dict[str, str]) -> None:
        self.root = data_dir / "provisioned"
        self.env = env

    async def provision(self, node_id: str, instance: InstanceType) -> int | None:
        await asyncio.sleep(instance.startup_delay_s)  # what a cloud takes to boot an instance
        self.root.mkdir(parents=True, exist_ok=True)
        cluster_file = self.root / f"{node_id}.toml"
        cluster_file.write_text(node_entry(node_id, instance))
        logs = self.root / f"{node_id}.log"
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.agent", "--node-id", node_id, "--cluster-file", str(cluster_file),
            env={**self.env, "TRAINMASTER_USE_NVML": "false"}, stdout=logs.open("ab"), stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        (self.root / f"{node_id}.pid").write_text(str(process.pid))  # `make run` stops it with the stack
        log.info("provisioned %s (%s) as process %d", node_id, instance.name, process.pid)
        return process.pid

    async def release(self, node_id: str, handle: int | None) -> None:
        if handle:
            try:
                os.killpg(handle, signal.SIGTERM)
            except ProcessLookupError:
                pass
        (self.root / f"{node_id}.toml").unlink(missing_ok=True)
        (self.root / f"{node_id}.pid").unlink(missing_ok=True)
        log.info("released %s", node_id)
