"""Monitor wiring: owns the job status projection and node liveness."""

import logging
from pathlib import Path

from faststream import FastStream
from pydantic import Field

from shared.bus import HEARTBEATS, TRANSIENT_ERRORS, forget_starts
from shared.clock import utcnow
from shared.noderecords import limits_from_file
from shared.pings import Pings
from shared.service import Wiring, service_app
from shared.settings import CommonSettings, own_mongo_db, own_mongo_url
from shared.store import DEFER_PULLS_S, REMEMBER_JOBS, DocumentStore, relay
from services.monitor.fleet import Fleet
from services.monitor.handlers import JOBS, heartbeat_intake, router
from services.monitor.hangs import restart_overdue
from services.monitor.records import NodeRecords
from services.monitor.service import DEADLINE_INDEX, EXITS_DUE_INDEX, NODE_JOBS_INDEX, STOPS_DUE_INDEX, Monitor

SERVICE = "monitor"
CADENCE_CHECK_S = 5.0  # how often the heartbeat interval is sized to the fleet
SETTLE_TIMEOUT_S = 5.0  # a ping to the bus server before any node is declared lost
log = logging.getLogger(__name__)


class MonitorSettings(CommonSettings):
    mongo_url: str = own_mongo_url(SERVICE)
    mongo_db: str = own_mongo_db(SERVICE)
    liveness_check_s: float = 1.0
    persist_seen_s: float = Field(
        30.0, gt=0, description="How often nodes' last_seen is written (in bulk); liveness itself lives in memory."
    )
    heartbeats_per_s: float = Field(
        2500.0,
        ge=0,
        description="Heartbeats a second the control plane takes: a "
        "larger fleet is told to heartbeat less often (the node timeout grows with the "
        "interval); 0 keeps the configured interval whatever the fleet's size.",
    )
    cluster_file: Path = Field(
        Path("cluster.toml"),
        description="Its [[nodes]] are the static nodes' records: a registration is capped to its entry.",
    )
    hang_grace_s: float = Field(
        300.0,
        ge=0,
        description="How long a job suspected hung (Running[Hanging]) may "
        "show signs of life again before it is snapshotted and restarted.",
    )


def create_app(settings: MonitorSettings | None = None) -> FastStream:
    settings = settings or MonitorSettings()

    async def setup(w: Wiring) -> Monitor:
        # Jobs are remembered as last written (the monitor and its relay are their only writers); nodes are not:
        # their last_seen is written in bulk beside the store.
        jobs = DocumentStore(w.db.monitor_jobs, w.broker, remember=REMEMBER_JOBS, defer_pulls_s=DEFER_PULLS_S)
        monitor = Monitor(
            jobs=jobs,
            nodes=DocumentStore(w.db.monitor_nodes, w.broker),
            node_timeout_s=settings.node_timeout_s,
            started_at=utcnow(),
            link=w.link,
            fleet=Fleet(persist_every_s=settings.persist_seen_s),
            heartbeat_interval_s=settings.heartbeat_interval_s,
            heartbeats_per_s=settings.heartbeats_per_s,
            records=NodeRecords(static=limits_from_file(settings.cluster_file), rented=w.db.monitor_rented),
            early=w.db.monitor_early_terminates,
        )
        await monitor.load_early()
        await jobs.collection.create_index(DEADLINE_INDEX)  # the overdue sweep reads only what is due
        await jobs.collection.create_index(EXITS_DUE_INDEX)  # so does the sweep of exits kept for their start
        await jobs.collection.create_index(STOPS_DUE_INDEX)  # and of stops no exit answered
        await jobs.collection.create_index(NODE_JOBS_INDEX)  # a node's loss reads its unfinished jobs
        log.info("%d nodes known", await monitor.load_fleet())
        # Heartbeats: core NATS, read as they come (no stream, no ack, no database); the intake's queue length
        # tells the liveness check whether it has read all that arrived.
        client = w.broker.config.connection_state.connection
        intake = await client.subscribe(
            HEARTBEATS,
            cb=heartbeat_intake(monitor),
            pending_msgs_limit=1_000_000,
            pending_bytes_limit=512 * 1024 * 1024,
        )
        monitor.backlog = lambda: intake.pending_msgs
        pings = Pings(lambda: client)  # a flush bounded by its own timeout could end the client's read loop
        w.closing.append(pings.close)
        monitor.settle = lambda: pings.wait(timeout_s=SETTLE_TIMEOUT_S)
        monitor.forget_starts = lambda node_id: forget_starts(w.broker, node_id)
        w.background.spawn("outbox", lambda: relay(w.broker, [monitor.jobs.collection, monitor.nodes.collection]))
        w.background.every("liveness", settings.liveness_check_s, monitor.check_liveness)
        w.background.every("cadence", CADENCE_CHECK_S, monitor.announce_cadence, tolerate=TRANSIENT_ERRORS)
        w.background.every(
            "hangs",
            settings.liveness_check_s,
            lambda: restart_overdue(monitor, grace_s=settings.hang_grace_s, now=utcnow()),
        )
        w.background.every("last-seen", settings.persist_seen_s, monitor.persist_seen, tolerate=TRANSIENT_ERRORS)
        await JOBS.resume(w.broker)  # before any job event is read
        return monitor

    return service_app(name=SERVICE, settings=settings, router=router, setup=setup)
