"""Agent wiring: one process per compute node."""

import logging
import os
import signal
import sys
from functools import partial
from pathlib import Path
from typing import Any

from faststream import FastStream
from nats.aio.msg import Msg
from pydantic import Field, model_validator

from shared.bus import NODE_CADENCE, keyed_anew, publish
from shared.cluster import read_cluster
from shared.pings import Pings
from shared.service import Wiring, service_app, wire
from shared.settings import CommonSettings
from shared.storage import StoragePolicy, StorageSettings, check_segment, local_path
from services.agent import jobsecrets
from services.agent.agent import Agent
from services.agent.carriage import UPDATE_EVERY_S
from services.agent.cgroups import detect
from services.agent.checkpoints import CheckpointStore
from services.agent.downloads import Downloads
from services.agent.fence import (
    CHECK_S,
    DEFAULT_GRACE_S,
    DEFAULT_MARGIN_S,
    Fence,
    fitted_grace,
    fitted_margin,
    margin_problem,
)
from services.agent.gpudevices import GpuFile, device_files
from services.agent.handlers import command_router
from services.agent.hangs import DEFAULT_TIMEOUT_S, HangPolicy
from services.agent.isolation import (
    Confinement,
    TaskUsers,
    close_to_others,
    confinement,
    is_root,
    private_dir,
    shadow_uid,
)
from services.agent.nvml import GpuProbe
from services.agent.outputrate import OutputRate
from services.agent.pace import Pace
from services.agent.preparation import Preparer
from services.agent.rekey import Keying, keep_own_key, own_creds
from services.agent.resources import describe_node, node_entries
from services.agent.retention import SWEEP_S, Retention
from services.agent.runner import SDK_DIR
from services.agent.shim import mount_namespaces_refused
from services.agent.sizecap import GB, Tally
from services.agent.spot import SpotWatcher, leave_on_notice
from services.agent.throughput import measure_tflops
from services.agent.uidrange import LAST_UID, account_uids, accounts_within, claim_range, subordinate_spans

log = logging.getLogger(__name__)

# where claims go when the first uid is configured by hand: every stack of the host that shares such a range sees
# the others' claims (a range from the registry is the stack's alone, its claims under its data directory)
SHARED_LOCKS = Path("/run/trainmaster/task-uids")


class AgentSettings(CommonSettings, StorageSettings):
    node_id: str
    use_nvml: bool = True
    measure_gpus: bool = Field(
        True,
        description="Measure each NVML GPU's dense BF16 matmul TFLOPS at start (a "
        "separate process; placement plans with it, bounded by the table's figure).",
    )
    measure_python: str = Field("", description="The Python with torch and CUDA that measures (empty: the agent's).")
    measure_timeout_s: float = Field(
        60.0, gt=0, le=600, description="The measurement is killed past this; the table's figures stand."
    )
    shutdown_grace_s: float = 5
    checkpoint_sync_s: float = 5
    hang_timeout_s: float = Field(
        DEFAULT_TIMEOUT_S,
        ge=0,
        description="The cluster's hang timeout: a task with "
        "no sign of life this long is reported hung (a job's spec.hang_timeout_s wins); "
        "0 turns detection off.",
    )
    hang_gpu_busy_percent: float = Field(
        5.0, ge=0, le=100, description="A task's GPU at or above this utilisation (NVML) is a sign of life."
    )
    task_uid_first: int | None = Field(
        None,
        ge=1000,
        description="Tasks run as uids from here (when root); "
        "unset: this stack's own range, from the host's registry of ranges.",
    )
    task_uid_count: int = Field(65_536, ge=1, description="How many uids tasks may use (one per running task).")
    task_uid_lock_dir: Path | None = Field(
        None,
        description="Claims shared by this stack's agents on the host, "
        "so two running tasks never share a uid (unset: <data dir>/task-uids, "
        "or /run/trainmaster/task-uids when task_uid_first is set).",
    )
    task_uid_registry: Path = Field(
        Path("/run/trainmaster/task-uid-ranges.json"),
        description="Every stack's uid range on this host, by data directory: two stacks never share a uid.",
    )
    task_tmpfs_mb: int = Field(
        1024,
        ge=1,
        description="Size of each of a task's private /tmp, /var/tmp, /dev/shm "
        "and /run/lock (memory, counted in its memory limit); a task with a cgroup gets a /dev/shm "
        "as large as its host memory.",
    )
    task_disk_gb: float = Field(
        100,
        ge=0,
        description="Most a task may write to its working directory "
        "(measured every 2 s; no single file larger); 0: no quota.",
    )
    download_max_gb: float = Field(
        50,
        ge=0,
        description="Most one of a task's downloads (its code_dir, an input, its restored checkpoint) may write "
        "to the node's disk; past it the download stops, its file is removed and the task fails; 0: no cap.",
    )
    task_downloads_max_gb: float = Field(
        100, ge=0, description="Most a task's code_dir and inputs may write all together, likewise; 0: no cap."
    )
    task_pids_max: int = Field(16_384, ge=16, description="Most processes and threads a task may have at once.")
    task_cgroups: bool = Field(
        True,
        description="A cgroup per task (memory_gb and task_pids_max enforced by the "
        "kernel) where the host lets the agent make them.",
    )
    task_pin_cpus: bool = Field(
        True,
        description="Pin each task to as many of the host's CPUs as it was given, those the fewest tasks hold (its "
        "threads then size themselves to its share); off where several agents share one host and so cannot share "
        "its CPUs out between them (`make run`'s stack turns it off there). A task's cgroup caps its CPU time "
        "either way, where it has one.",
    )
    task_hide_other_gpus: bool = Field(
        False,
        description="Keep each task from the GPUs it was not given: their device files are unreadable in its view "
        "(services/agent/gpudevices.py). Off until checked on each GPU generation in use (`make test-gpu`); "
        "without it a task that ignores CUDA_VISIBLE_DEVICES can use another task's GPU.",
    )
    task_shared_dirs: list[Path] = Field(
        default_factory=list,
        description="Paths every task may reach (their own permissions apply), such as a read-only dataset directory.",
    )
    spot_metadata_url: str | None = Field(
        None,
        description="Instance metadata to watch for a spot interruption "
        "notice (EC2: http://169.254.169.254); off when unset.",
    )
    spot_poll_s: float = Field(5.0, gt=0, description="How often the spot metadata is read.")
    nats_rekey: bool = Field(
        False,
        description="A rented node's agent: trade the bus identity the node was started with (user data, a Secret) "
        "for one of a key it makes itself, once (services/agent/rekey.py); placement's providers set it.",
    )
    spot_act_on_rebalance: bool = Field(False, description="Leave on a rebalance recommendation too.")
    output_lines_per_s: float = Field(
        500.0,
        gt=0,
        description="Lines a second a task may print; past it (and its "
        "burst) lines are dropped and one notice line says how many.",
    )
    output_bytes_per_s: float = Field(64 * 1024, gt=0, description="Bytes a second a task may print, likewise.")
    output_burst_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Seconds of either allowance a quiet task "
        "saves up for a burst (a dependency install, a stack trace).",
    )
    output_update_s: float = Field(
        UPDATE_EVERY_S,
        gt=0,
        le=3600,
        description="A bar a task redraws with "
        "carriage returns (tqdm, Keras) goes out as its latest frame at most this often, "
        "and its last frame always.",
    )
    attempt_retention_s: float = Field(
        3600.0,
        ge=0,
        description="How long a finished attempt's directory (code, inputs, outputs, its checkpoint copy, "
        "output.log) stays on the node once its end is reported (everything in it is stored by then); 0: removed "
        "at once. A restarted agent counts what its previous run left from its start.",
    )
    attempts_kept_gb: float = Field(
        20.0,
        ge=0,
        description="Most the finished attempts' directories may hold on the node together; past it the oldest "
        "are removed first, whatever their retention.",
    )
    fence: bool = Field(
        True,
        description="Stop this node's tasks when the bus stops acknowledging its heartbeats "
        "(before the monitor could call the node lost and run their jobs elsewhere). Off: a "
        "node cut off from the bus keeps running its tasks beside their next attempts until it "
        "is back and told to stop; a bus outage longer than the window no longer stops every task.",
    )
    fence_margin_s: float = Field(
        DEFAULT_MARGIN_S,
        gt=0,
        description="The agent stops its own tasks once no heartbeat it sent in the "
        "node timeout less this has been acknowledged by the bus, so they are dead before "
        "the monitor can call the node lost and place their jobs again; it must hold twice "
        "fence_grace_s and 0.75 s more (services/agent/fence.py). Unset: 4 s, or for a node timeout "
        "that leaves less than two heartbeats past 4 s, 0.4 of the timeout (at most what leaves two).",
    )
    fence_grace_s: float = Field(
        DEFAULT_GRACE_S,
        ge=0,
        description="SIGTERM to SIGKILL for a task its agent stops when the bus stopped answering. "
        "Unset: 1 s, or what the margin holds.",
    )

    @model_validator(mode="before")
    @classmethod
    def _fit_fence(cls, data: Any) -> Any:
        """A fence margin or grace not set is fitted to the node timeout and heartbeat interval the agent is given
        (a rented node gets the stack's: a short timeout with the 4 s default margin would not start)."""
        if not isinstance(data, dict) or ("fence_margin_s" in data and "fence_grace_s" in data):
            return data
        fields = cls.model_fields
        try:
            timeout_s = float(data.get("node_timeout_s", fields["node_timeout_s"].default))
            interval_s = float(data.get("heartbeat_interval_s", fields["heartbeat_interval_s"].default))
            margin_s = float(data.get("fence_margin_s", fitted_margin(timeout_s=timeout_s, interval_s=interval_s)))
        except (TypeError, ValueError):  # not numbers: the fields' own validation says so
            return data
        if margin_s <= 0:  # no fence fits this timeout: the defaults stand, and `_fence_fits` says why
            return data
        return {"fence_margin_s": margin_s, "fence_grace_s": fitted_grace(margin_s), **data}

    @model_validator(mode="after")
    def _fence_fits(self) -> "AgentSettings":
        problem = self.fence and margin_problem(
            timeout_s=self.node_timeout_s,
            margin_s=self.fence_margin_s,
            grace_s=self.fence_grace_s,
            interval_s=self.heartbeat_interval_s,
        )
        if problem:
            raise ValueError(problem)
        return self


def task_uid_first(settings: AgentSettings) -> int:
    """The first task uid (`range_first`), refused where the uids the range's processes are killed from
    (`isolation.shadow_uid`) hold one of the host's accounts or subordinate ids (a rootless container above 2**31)."""
    first = range_first(settings)
    if clash := accounts_within(shadow_uid(first), settings.task_uid_count, account_uids(), subordinate_spans()):
        raise SystemExit(
            f"the processes of task uids from {first} are killed from uids {shadow_uid(first)} on, which include uids "
            f"of this host's accounts or subordinate id ranges ({clash[:5]}): their processes would be killed too; set "
            "TRAINMASTER_TASK_UID_FIRST to a range whose shadows no account uses"
        )
    return first


def range_first(settings: AgentSettings) -> int:
    """The configured first task uid, else this stack's own range's from the host's registry."""
    if settings.task_uid_first is not None:
        first, count = settings.task_uid_first, settings.task_uid_count
        if clash := accounts_within(first, count, account_uids(), subordinate_spans()):
            raise SystemExit(
                f"TRAINMASTER_TASK_UID_FIRST={first} with TRAINMASTER_TASK_UID_COUNT={count} includes ids of this "
                f"host's accounts, groups or subordinate id ranges (from {clash[:5]}): a task would run as them; "
                "choose a range none uses"
            )
        if settings.task_uid_first + settings.task_uid_count - 1 > LAST_UID:
            raise SystemExit(
                f"TRAINMASTER_TASK_UID_FIRST={settings.task_uid_first} with TRAINMASTER_TASK_UID_COUNT="
                f"{settings.task_uid_count} goes past uid {LAST_UID}: the uids above are those task uids' processes "
                "are killed from; choose a lower range"
            )
        return settings.task_uid_first
    try:
        return claim_range(settings.task_uid_registry, data_dir=settings.data_dir, count=settings.task_uid_count)
    except (OSError, ValueError) as exc:
        raise SystemExit(
            f"no task uid range for this stack in {settings.task_uid_registry}: {exc}; set "
            "TRAINMASTER_TASK_UID_FIRST (and a lock directory every stack sharing it uses)"
        ) from exc


def task_uid_locks(settings: AgentSettings) -> Path:
    """Where this stack's agents claim uids: its own directory for its own range, the host's for a shared one."""
    if settings.task_uid_lock_dir is not None:
        return settings.task_uid_lock_dir
    return settings.data_dir / "task-uids" if settings.task_uid_first is None else SHARED_LOCKS


def hidden_gpus(settings: AgentSettings) -> dict[int, GpuFile]:
    """The GPUs' device files a task not given them cannot open (`task_hide_other_gpus`); none, said, where the
    agent does not read its GPUs from NVML."""
    if not settings.task_hide_other_gpus:
        return {}
    if not settings.use_nvml:
        log.warning("task_hide_other_gpus: this agent does not read its GPUs from NVML (use_nvml off): none is hidden")
        return {}
    return device_files()


def task_confinement(settings: AgentSettings, storage: StoragePolicy) -> Confinement:
    """Tasks as users of their own when the agent is root; as the agent's user in namespaces of their own
    otherwise (`shim.confine_own`)."""
    users = None
    if not is_root():
        log.warning(
            "the agent does not run as root: tasks run as its own user (uid %d), each in a user namespace of its own "
            "where the host permits one (its data directory, home and temporary folders covered); where it does "
            "not, a task can read what the agent can",
            os.geteuid(),
        )
    else:
        users = TaskUsers(
            first_uid=task_uid_first(settings), count=settings.task_uid_count, lock_dir=task_uid_locks(settings)
        )
    local_roots = [Path(p) for p in (local_path(storage.storage_root), local_path(storage.checkpoint_root)) if p]
    if users is not None and (refused := mount_namespaces_refused()) is not None:
        # no view of their own to cover these in (a Pod without CAP_SYS_ADMIN): every project's files were
        # readable to every task through their 0755 folders; closed, only the agent (root) copies in and out
        reached = [settings.data_dir, SDK_DIR, Path(sys.prefix), Path(sys.base_prefix), *settings.task_shared_dirs]
        open_ = close_to_others(local_roots, reached=reached)
        log.warning(
            "tasks get no mount namespaces of their own (%s): they run as users of their own with the host's view; "
            "the local storage folders are closed to them (0700)%s",
            refused,
            f", but for {', '.join(map(str, open_))} (not the agent's, not readable, `/`, or holding folders tasks "
            "must reach): every task may read them"
            if open_
            else "",
        )
    return confinement(
        users=users,
        sdk_dir=SDK_DIR,
        data_dir=settings.data_dir,
        storage_dirs=local_roots,
        shared_dirs=settings.task_shared_dirs,
        tmpfs_mb=settings.task_tmpfs_mb,
        cgroups=detect(pids_max=settings.task_pids_max, enabled=settings.task_cgroups) if users else None,
        gpu_files=hidden_gpus(settings),
    )


def build_agent(settings: AgentSettings, w: Wiring, pace: Pace, acks: Pings, keying: Keying | None = None) -> Agent:
    """The node described (NVML or the cluster file), its storage, engines, task confinement and fence."""
    cluster = read_cluster(settings.cluster_file)
    entries = node_entries(cluster, source=settings.cluster_file)
    if settings.node_id not in entries:
        raise SystemExit(f"node {settings.node_id!r} is not in {settings.cluster_file} (has: {', '.join(entries)})")
    measure = partial(measure_tflops, python=settings.measure_python, timeout_s=settings.measure_timeout_s)
    node = describe_node(
        entries[settings.node_id],
        use_nvml=settings.use_nvml,
        virtual=True,
        measure=measure if settings.measure_gpus else None,
        bus_url=settings.nats_url,
    )
    storage = settings.storage_policy(settings.data_dir)
    root = private_dir(private_dir(settings.data_dir / "agents") / check_segment(node.node_id))
    return Agent(
        node=node,
        root=root,
        publish=lambda message: publish(w.broker, message),
        checkpoints=CheckpointStore(
            storage.checkpoint_root, max_bytes=int(settings.download_max_gb * GB) if settings.download_max_gb else None
        ),
        preparer=Preparer(
            root / "engines",
            cluster.engines_by_name(),
            downloads=Downloads(policy=storage.egress()),
            storage=storage,
            caps=partial(
                Tally.of, per_download_gb=settings.download_max_gb, per_task_gb=settings.task_downloads_max_gb
            ),
        ),
        storage=storage,
        confinement=task_confinement(settings, storage),
        checkpoint_sync_s=settings.checkpoint_sync_s,
        shutdown_grace_s=settings.shutdown_grace_s,
        disk_quota_gb=settings.task_disk_gb,
        pin_cpus=settings.task_pin_cpus,
        hangs=HangPolicy(
            timeout_s=settings.hang_timeout_s,
            busy_percent=settings.hang_gpu_busy_percent,
            gpus=GpuProbe() if node.resources_source == "nvml" else None,
        ),
        output_rate=lambda: OutputRate(
            lines_per_s=settings.output_lines_per_s,
            bytes_per_s=settings.output_bytes_per_s,
            burst_s=settings.output_burst_s,
        ),
        output_update_s=settings.output_update_s,
        fence=Fence(
            timeout_s=lambda: node_timeout_s(pace, settings),
            margin_s=settings.fence_margin_s,
            grace_s=settings.fence_grace_s,
            interval_s=lambda: pace.interval_s,
        )
        if settings.fence
        else None,
        acknowledge=lambda: acks.wait(timeout_s=max(1.0, pace.interval_s)),
        connected=lambda: w.broker.config.connection_state.connection.is_connected,
        secrets=partial(
            jobsecrets.fetch,
            lambda: w.broker.config.connection_state.connection,
            node_id=node.node_id,
            keyed=keying.check if keying is not None else None,
        ),
        retention=Retention(
            jobs=root / "jobs",
            retention_s=settings.attempt_retention_s,
            budget_bytes=int(settings.attempts_kept_gb * GB),
        ),
    )


def node_timeout_s(pace: Pace, settings: AgentSettings) -> float:
    """The silence after which the monitor calls a node lost: as it last announced it (it grows with the fleet, and
    a shorter one is in force only once every agent could hear it), else as the monitor is configured (the same
    `node_timeout_s` setting)."""
    return pace.timeout_s or settings.node_timeout_s


def fence_check(pace: Pace, settings: AgentSettings) -> str | None:
    """What is wrong with fencing at the pace the monitor announced (a monitor configured apart from its agents)."""
    return margin_problem(
        timeout_s=node_timeout_s(pace, settings),
        margin_s=settings.fence_margin_s,
        grace_s=settings.fence_grace_s,
        interval_s=pace.interval_s,
    )


def create_app(settings: AgentSettings) -> FastStream:
    given = settings.nats_creds
    if settings.nats_rekey and given is not None:  # its own copy, which a trade replaces
        settings = settings.model_copy(
            update={"nats_creds": own_creds(given, data_dir=settings.data_dir, node_id=settings.node_id)}
        )
    w = wire(name=f"agent-{settings.node_id}", settings=settings, health=f"agent.{settings.node_id}")
    # The monitor slows every agent's heartbeat down on a large fleet (NodeCadence; never below our own).
    pace = Pace(settings.heartbeat_interval_s)
    acks = Pings(lambda: w.broker.config.connection_state.connection)
    w.closing.append(acks.close)  # once the connection is closed: a PING still unanswered is given up
    keying = Keying() if settings.nats_rekey and given is not None else None  # its own key asks for secrets
    agent = build_agent(settings, w, pace, acks, keying)
    node = agent.node
    w.broker.include_router(command_router(node.node_id))
    w.broker.context.set_global("agent", agent)

    async def loops() -> None:
        client = w.broker.config.connection_state.connection

        async def heard(msg: Msg) -> None:
            pace.heard(msg.data)
            # a monitor configured apart from its agents: a window under two heartbeats fences nothing (Fence.due)
            if settings.fence and (problem := fence_check(pace, settings)):
                log.error("the node timeout the monitor announces does not suit this agent's fence (off): %s", problem)

        await client.subscribe(NODE_CADENCE, cb=heard)
        w.background.every("heartbeat", lambda: pace.interval_s, agent.heartbeat)
        w.background.every("finished attempts", SWEEP_S, agent.sweep_attempts)
        if settings.fence:
            w.background.every("fence", CHECK_S, agent.fence_if_unheard)
        if settings.spot_metadata_url:
            watcher = SpotWatcher(
                url=settings.spot_metadata_url,
                poll_s=settings.spot_poll_s,
                act_on_rebalance=settings.spot_act_on_rebalance,
                on_notice=leave_on_notice(agent, exit_process=lambda: os.kill(os.getpid(), signal.SIGTERM)),
            )
            w.background.spawn("spot", watcher.run)
        if settings.nats_rekey and given is not None:  # its creds: its own copy (create_app)
            own = settings.nats_creds or given
            w.background.spawn(
                "own key",
                lambda: keep_own_key(
                    client,
                    node_id=node.node_id,
                    creds=own,
                    given=given,
                    keyed=lambda p: keyed_anew(w.broker, p),
                    keying=keying,
                ),
            )
        log.info("agent for node %s (%s, %d GPUs) up", node.node_id, node.kind, len(node.gpus))

    async def started() -> None:
        await agent.come_up(loops)

    async def stopping() -> None:
        await agent.shutdown()
        await w.background.stop()

    # it binds to the command consumer made for it (it may create none); it keeps no database
    app = service_app(settings=settings, wiring=w, database=False, after_startup=[started], on_shutdown=[stopping])
    return app
