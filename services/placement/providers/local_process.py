"""`local-process` starts an agent process on this machine that registers as an on-demand node of the requested
instance type once its start-up delay has passed (for `make run` and tests)."""

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from services.placement.policy import InstanceType
from services.placement.providers.base import REGISTER_PATIENCE_S, node_entry
from services.placement.providers.credentials import NodeCredentials

log = logging.getLogger(__name__)


RELEASE_GRACE_S = 20.0  # the agent's own shutdown grace (tasks get SIGTERM, then SIGKILL) plus its reports


async def stop_group(group: int, *, grace_s: float) -> None:
    """SIGTERM a process group, SIGKILL whatever is left of it after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        for _ in range(int(grace_s * 10) if sig == signal.SIGTERM else 0):
            await asyncio.sleep(0.1)
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return


class LocalProcessProvider:
    name = "local-process"

    def __init__(self, *, data_dir: Path, env: dict[str, str], credentials: NodeCredentials | None = None) -> None:
        self.root = data_dir / "provisioned"
        # placement's own, never an agent's (an agent never talks to the database either)
        secrets = ("TRAINMASTER_NATS_CREDS", "TRAINMASTER_NATS_MINTER", "TRAINMASTER_ADMIN_TOKEN", "MONGO_URL")
        self.env = {k: v for k, v in env.items() if k not in secrets}
        self.credentials = credentials

    async def provision(self, node_id: str, instance: InstanceType) -> int | None:
        await asyncio.sleep(instance.startup_delay_s)  # what a cloud takes to boot an instance
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        cluster_file = self.root / f"{node_id}.toml"
        cluster_file.write_text(node_entry(node_id, instance))
        # its agent shares this host with the stack's: the kernel places its tasks on the host's CPUs, not each agent
        env = {**self.env, "TRAINMASTER_USE_NVML": "false", "TRAINMASTER_TASK_PIN_CPUS": "false"}
        if self.credentials:
            # its boot is over (slept above): its agent starts now, registering within the patience
            issued = await self.credentials.issue(node_id, self.root, boot_s=REGISTER_PATIENCE_S)
            env["TRAINMASTER_NATS_CREDS"] = str(issued)
            env["TRAINMASTER_NATS_REKEY"] = "true"  # placement's copy of it is worthless once the agent rekeyed
            if self.credentials.ca_file:
                env["TRAINMASTER_NATS_CA_FILE"] = str(self.credentials.ca_file)
        logs = self.root / f"{node_id}.log"
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "services.agent",
            "--node-id",
            node_id,
            "--cluster-file",
            str(cluster_file),
            env=env,
            stdout=logs.open("ab"),
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        (self.root / f"{node_id}.pid").write_text(str(process.pid))  # `make run` stops it with the stack
        log.info("provisioned %s (%s) as process %d", node_id, instance.name, process.pid)
        return process.pid

    async def release(self, node_id: str, handle: int | None) -> None:
        """Stop the node's agent (it reports its tasks' ends on the way out), then take its identity back: an
        agent whose credentials go first could never finish reporting and would never exit."""
        if handle:
            await stop_group(handle, grace_s=RELEASE_GRACE_S)
        (self.root / f"{node_id}.toml").unlink(missing_ok=True)
        (self.root / f"{node_id}.pid").unlink(missing_ok=True)
        if self.credentials:
            await self.credentials.revoke(node_id, self.root)
        log.info("released %s", node_id)
