"""Placement wiring: a single process that owns the queue and decides where each attempt runs."""
import os
import tomllib
from pathlib import Path

from faststream import FastStream
from faststream.nats import NatsBroker
from pydantic import Field

from shared.service import Wiring, service_app
from shared.settings import CommonSettings
from shared.store import DocumentStore, relay
from services.placement.adapter import catalogue_from
from services.placement.fleet import Fleet
from services.placement.handlers import router
from services.placement.policy import PolicyConfig
from services.placement.providers import LocalProcessProvider, NodeCredentials
from services.placement.service import Placement, scheduling_loop

SERVICE = "placement"


class PlacementSettings(CommonSettings):
    schedule_tick_s: float = 5.0
    slow_factor: float = Field(1.5, gt=1, description="Estimated total beyond this times the expected: too slow.")
    cluster_file: Path = Field(Path("cluster.toml"), description="Its [[instance_types]] are the on-demand catalogue.")
    policy: str = Field("trainmaster", description="trainmaster, local-fifo, burst or wait-local.")
    idle_release_s: float = Field(600, ge=0, description="On-demand nodes idle this long are given back.")
    pullback_min_remaining_s: float = Field(3600, ge=0, description="Pull back only jobs with this much left.")
    migration_s: float = Field(300, ge=0, description="What a snapshot and restore cost in time (pull-back sums).")
    provider: str = Field("local-process", description="Where on-demand nodes come from.")
    nats_minter: Path | None = Field(None, description="Mints and revokes rented nodes' bus credentials (`make run` "
                                     "writes it); without it rented agents get none (a server without auth).")


def create_app(settings: PlacementSettings | None = None) -> FastStream:
    settings = settings or PlacementSettings()

    async def setup(w: Wiring) -> Placement:
        cluster = load_cluster_file(settings.cluster_file)
        fleet = Fleet(store=DocumentStore(w.db.placement_nodes, w.broker),
                      provider=make_provider(settings, w.broker),
                      catalogue=catalogue_from(cluster.get("instance_types", [])))
        config = PolicyConfig(policy=settings.policy, idle_release_s=settings.idle_release_s,
                              pullback_min_remaining_s=settings.pullback_min_remaining_s,
                              migration_s=settings.migration_s)
        placement = Placement(jobs=DocumentStore(w.db.placement_jobs, w.broker), fleet=fleet,
                              slow_factor=settings.slow_factor, config=config, flavors=cluster.get("flavors", []))
        await placement.load()
        w.background.spawn("outbox", lambda: relay(w.broker, [placement.jobs.collection, fleet.store.collection]))
        w.background.spawn("schedule", lambda: scheduling_loop(placement, tick_s=settings.schedule_tick_s))
        return placement

    return service_app(name=SERVICE, settings=settings, router=router, setup=setup)


def make_provider(settings: PlacementSettings, broker: NatsBroker) -> LocalProcessProvider:
    if settings.provider != "local-process":
        raise SystemExit(f"unknown provider {settings.provider!r} (available: local-process)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINMASTER_NODE_ID")}  # children are agents
    credentials = NodeCredentials(minter_file=settings.nats_minter, broker=broker, nats_url=settings.nats_url,
                                  ca_file=settings.nats_ca_file) if settings.nats_minter else None
    return LocalProcessProvider(data_dir=settings.data_dir.resolve(), env=env, credentials=credentials)


def load_cluster_file(path: Path) -> dict:
    """Its [[instance_types]] (the on-demand catalogue) and [[flavors]]."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
