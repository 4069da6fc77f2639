"""Where on-demand nodes come from. `local-process` starts an agent process on this machine that registers as an
on-demand node of the requested instance type once its start-up delay has passed (for `make run` and tests);
a cloud provider implements the same two calls with the cloud's API.

Each rented node gets bus credentials of its own, minted here (placement holds the application account's signing
key) and handed to its agent in a 0600 file; they are revoked on the server when the node is released."""
import asyncio
import logging
import os
import signal
import ssl
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import nats
from faststream.nats import NatsBroker
from nats.aio.client import RawCredentials

from shared import busroles
from shared.bus import create_agent_consumer
from shared.buscreds import NAME, Minter, write_secret
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


@dataclass
class NodeCredentials:
    """Bus identities of rented nodes: minted at provisioning, revoked on the server at release."""

    minter_file: Path  # the account signing key, the operator signing key and the revocations so far
    broker: NatsBroker
    nats_url: str
    ca_file: Path | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one read-modify-write of the minter file at a time

    async def issue(self, node_id: str, folder: Path) -> Path:
        """Mint the node's agent credentials (0600 file) and create the consumer of its commands."""
        if not NAME.match(node_id):
            raise ValueError(f"param[node_id] invalid: {node_id!r} cannot be a bus subject token")
        user, text = Minter.load(self.minter_file).mint(name=f"agent-{node_id}", permissions=busroles.agent(node_id))
        write_secret(folder / f"{node_id}.user", user)
        await create_agent_consumer(self.broker, node_id)
        return write_secret(folder / f"{node_id}.creds", text)

    async def revoke(self, node_id: str, folder: Path) -> None:
        """Revoke the node's user: recorded first (a restarted server is configured with it), then pushed; a
        failure raises, so the release is tried again and the node stays ours until its identity is gone."""
        user_file = folder / f"{node_id}.user"
        if not user_file.exists():
            return
        async with self.lock:
            minter = Minter.load(self.minter_file)
            account = minter.revoke(user_file.read_text().strip())
            write_secret(self.minter_file, minter.to_json())
        tls = ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file else None
        client = await nats.connect(self.nats_url, user_credentials=RawCredentials(minter.system_creds), tls=tls,
                                    inbox_prefix=busroles.inbox("account-updater"), connect_timeout=5,
                                    max_reconnect_attempts=3)
        try:
            reply = await client.request(f"$SYS.REQ.ACCOUNT.{minter.account}.CLAIMS.UPDATE", account.encode(),
                                         timeout=5)
            if b'"error"' in reply.data:
                raise RuntimeError(f"the server refused the revocation of {node_id}: {reply.data[:300]!r}")
        finally:
            await client.close()
        user_file.unlink(missing_ok=True)
        (folder / f"{node_id}.creds").unlink(missing_ok=True)
        log.info("revoked the bus credentials of %s", node_id)


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
        env = {**self.env, "TRAINMASTER_USE_NVML": "false"}
        if self.credentials:
            env["TRAINMASTER_NATS_CREDS"] = str(await self.credentials.issue(node_id, self.root))
            if self.credentials.ca_file:
                env["TRAINMASTER_NATS_CA_FILE"] = str(self.credentials.ca_file)
        logs = self.root / f"{node_id}.log"
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.agent", "--node-id", node_id, "--cluster-file", str(cluster_file),
            env=env, stdout=logs.open("ab"), stderr=asyncio.subprocess.STDOUT, start_new_session=True,
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
