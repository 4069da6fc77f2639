"""What the cloud providers share: the offers they rent (from the catalogue), the node's start-up bundle with its
own minted credentials, and a cool-down for instance types the cloud has no capacity for."""

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from services.placement.policy import InstanceType
from services.placement.providers.base import boot_allowance_s, node_entry
from services.placement.providers.bootstrap import Bootstrap, Liveness, NodeBoot, agent_env
from services.placement.providers.credentials import NodeCredentials


class OfferInfo(BaseModel):
    """How a catalogue entry is rented: by which provider, which cloud type, on-demand or spot, where."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    provider: str = "local-process"
    market: str = Field("on_demand", pattern="^(on_demand|spot)$")
    cloud_type: str = ""
    zones: tuple[str, ...] = ()
    node_selector: dict[str, str] = Field(default_factory=dict)
    price_per_hour: float = 0.0


def offer_infos(entries: list[Mapping]) -> dict[str, OfferInfo]:
    return {
        str(e["name"]): OfferInfo.model_validate({**e, "cloud_type": e.get("cloud_type") or str(e["name"])})
        for e in entries
    }


@dataclass
class Cooldown:
    """Instance types the cloud refused for lack of capacity or quota, until when (placement hides them)."""

    seconds: float = 600.0
    until: dict[str, float] = field(default_factory=dict)

    def refuse(self, name: str, now: float | None = None) -> None:
        self.until[name] = (time.time() if now is None else now) + self.seconds

    def available(self, name: str, now: float | None = None) -> bool:
        return self.until.get(name, 0.0) <= (time.time() if now is None else now)


@dataclass
class NodeMaker:
    """Builds a rented node's start-up bundle, minting its credentials (kept under `folder` until release)."""

    boot: NodeBoot
    folder: Path
    credentials: NodeCredentials | None = None
    ca_text: str | None = None
    job_of: Callable[[str], str | None] = lambda node_id: None
    liveness: Liveness | None = None  # the stack's heartbeat interval and node timeout, for its agent

    async def bundle(
        self,
        node_id: str,
        instance: InstanceType,
        *,
        root: str,
        spot: bool,
        data_dir: str | None = None,
        consumer: bool = True,
        provider: str | None = None,
    ) -> Bootstrap:
        """consumer: False where the machine must be launched before the minter grants it (`launched`); provider:
        the one renting it (the minter checks the node against it alone)."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        creds = None
        if self.credentials:
            issued = await self.credentials.issue(
                node_id, self.folder, boot_s=boot_allowance_s(instance), consumer=consumer, provider=provider
            )
            creds = issued.read_text()
        ca = self.ca_text or (
            self.credentials.ca_file.read_text() if self.credentials and self.credentials.ca_file else None
        )
        env = agent_env(
            self.boot,
            root=root,
            spot=spot,
            has_creds=creds is not None,
            has_ca=ca is not None,
            data_dir=data_dir,
            liveness=self.liveness,
        )
        return Bootstrap(node_id=node_id, cluster_entry=node_entry(node_id, instance), env=env, creds=creds, ca=ca)

    async def launched(self, node_id: str, instance: InstanceType) -> None:
        """The node's command consumer, once its machine is launched (a minter that asks the cloud grants it only
        for a pending or running instance or Pod)."""
        if self.credentials:
            await self.credentials.create_consumer(node_id, boot_s=boot_allowance_s(instance))

    async def forget(self, node_id: str) -> None:
        """Revoke the node's credentials (idempotent)."""
        if self.credentials:
            await self.credentials.revoke(node_id, self.folder)
