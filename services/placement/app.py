"""Placement wiring: a single process that owns the queue and decides where each attempt runs."""

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from faststream import FastStream
from faststream.nats import NatsBroker
from pydantic import Field

from shared.cluster import read_cluster
from shared.noderecords import limits_of
from shared.service import Wiring, service_app
from shared.settings import CommonSettings, own_mongo_db, own_mongo_url
from shared.store import DEFER_PULLS_S, REMEMBER_JOBS, DocumentStore, relay
from services.placement.adapter import catalogue_from
from services.placement.catalogue import catalogue_entries
from services.placement.estimates import Estimates
from services.placement.fairshare import FairShare
from services.placement.fleet import Fleet
from services.placement.handlers import JOBS, router
from services.placement.policy import PolicyConfig
from services.placement.providers.bootstrap import Liveness
from services.placement.providers.reconcile import Providers, reconcile_loop
from services.placement.providers.wiring import bind, make_providers
from services.placement.queue import purge_loop
from services.placement.service import Placement, scheduling_loop
from services.placement.tradeoff import tradeoff_from
from services.placement.warmup import warm_up

SERVICE = "placement"


class PlacementSettings(CommonSettings):
    mongo_url: str = own_mongo_url(SERVICE)
    mongo_db: str = own_mongo_db(SERVICE)
    schedule_tick_s: float = 5.0
    slow_factor: float = Field(1.5, gt=1, description="Estimated total beyond this times the expected: too slow.")
    cluster_file: Path = Field(Path("cluster.toml"), description="Its [[instance_types]] are the on-demand catalogue.")
    policy: str = Field("trainmaster", description="trainmaster, local-fifo, burst, burst-after or wait-local.")
    idle_release_s: float = Field(600, ge=0, description="On-demand nodes idle this long are given back.")
    pullback_min_remaining_s: float = Field(3600, ge=0, description="Pull back only jobs with this much left.")
    migration_s: float = Field(300, ge=0, description="What a snapshot and restore cost in time (pull-back sums).")
    provider: str = Field(
        "local-process",
        description="Where on-demand nodes come from, for catalogue entries "
        "that name no `provider` (local-process, ec2 or kubernetes).",
    )
    reconcile_s: float = Field(60, gt=0, description="How often cloud instances are matched with node records.")
    nats_minter: bool = Field(
        False,
        description="Ask the minter (`make run` starts it) for rented nodes' bus credentials, "
        "with this process's own; without it rented agents get none (a server without auth).",
    )


def create_app(settings: PlacementSettings | None = None) -> FastStream:
    settings = settings or PlacementSettings()

    async def setup(w: Wiring) -> Placement:
        cluster = read_cluster(settings.cluster_file, missing_ok=True)
        entries = catalogue_entries(cluster, base=settings.cluster_file.parent, default_provider=settings.provider)
        providers = make_provider(settings, w.broker, entries=entries, sections=cluster.providers)
        fleet = Fleet(
            store=DocumentStore(w.db.placement_nodes, w.broker),
            provider=providers,
            catalogue=catalogue_from(entries),
            static=limits_of(cluster),
        )
        bind(providers, fleet)
        tradeoff = tradeoff_from(cluster)
        config = PolicyConfig(
            policy=settings.policy,
            idle_release_s=settings.idle_release_s,
            pullback_min_remaining_s=settings.pullback_min_remaining_s,
            migration_s=settings.migration_s,
            exchange_rate=tradeoff.exchange_rate,
            cost_sensitive_weight=tradeoff.cost_sensitive_weight,
        )
        jobs = DocumentStore(w.db.placement_jobs, w.broker, remember=REMEMBER_JOBS, defer_pulls_s=DEFER_PULLS_S)
        placement = Placement(
            jobs=jobs,
            fleet=fleet,
            slow_factor=settings.slow_factor,
            config=config,
            flavors=cluster.flavors,
            fair=FairShare(w.db.placement_usage),
            tradeoff=tradeoff,
            estimates=Estimates(broker=w.broker),
        )
        await placement.load()
        warm_up(placement.inputs)  # the engine's first-run costs, before the first job (nothing is stored)
        w.background.spawn("outbox", lambda: relay(w.broker, [placement.jobs.collection, fleet.store.collection]))
        w.background.spawn("schedule", lambda: scheduling_loop(placement, tick_s=settings.schedule_tick_s))
        w.background.spawn("tombstones", lambda: purge_loop(placement.store))
        if providers.reconcilers():  # cloud instances no record owns are given back
            w.background.spawn(
                "reconcile", lambda: reconcile_loop(fleet=fleet, providers=providers, interval_s=settings.reconcile_s)
            )
        for watcher in providers.watchers():  # a node whose Pod failed is seen at once, not after its silence
            w.background.spawn(f"watch-{watcher.name}", lambda watcher=watcher: watcher.watch(placement.pod_failed))
        await JOBS.resume(w.broker)  # before any job event is read
        return placement

    return service_app(name=SERVICE, settings=settings, router=router, setup=setup)


def make_provider(
    settings: PlacementSettings, broker: NatsBroker, *, entries: Sequence[Mapping[str, Any]], sections: dict
) -> Providers:
    return make_providers(
        entries=entries,
        sections=sections,
        default=settings.provider,
        data_dir=settings.data_dir.resolve(),
        broker=broker,
        nats_url=settings.nats_url,
        minter=settings.nats_creds if settings.nats_minter else None,
        ca_file=settings.nats_ca_file,
        liveness=Liveness(heartbeat_interval_s=settings.heartbeat_interval_s, node_timeout_s=settings.node_timeout_s),
    )
