"""The node agent's behaviour: register, heartbeat, start and stop tasks, report how they end."""

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from shared.clock import utcnow
from shared.events import (
    MAX_RUNNING,
    LogChunk,
    Message,
    NodeHeartbeat,
    NodeRegistered,
    StartTask,
    StopTask,
    TaskExited,
    TaskRef,
)
from shared.nodes import NodeInfo
from shared.storage import StoragePolicy
from services.agent.carriage import UPDATE_EVERY_S
from services.agent.checkpoints import CheckpointStore
from services.agent.fence import FENCED, Fence, window_s
from services.agent.hangs import HangPolicy
from services.agent.isolation import Confinement, private_dir
from services.agent.journal import Journal
from services.agent.outputrate import OutputRate
from services.agent.preparation import Preparer
from services.agent.retention import Retention, attempt_dirs, remove_empty
from services.agent.runner import TaskProcess, clear_launches
from services.agent.silences import Heard, load, save, unheard_for_s
from services.agent.supervision import Supervisor, exited_event, started_event
from services.agent.telemetry import group_pids, task_samples
from services.agent.tmplink import forget_links

log = logging.getLogger(__name__)

# Once the agent stops, what the bus will not take is retried this much longer than the tasks' grace, then given up:
# an end not sent stays unreported in the journal, and the next run of the agent reports it.
SEND_AFTER_GRACE_S = 5.0

Publish = Callable[[Message], Awaitable[None]]
Acknowledge = Callable[[], Awaitable[None]]  # returns once the server has everything published so far, else raises


BEAT_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="heartbeat")  # the heartbeat's GPU readings


class Agent:
    def __init__(
        self,
        *,
        node: NodeInfo,
        root: Path,
        publish: Publish,
        checkpoints: CheckpointStore,
        preparer: Preparer,
        storage: StoragePolicy,
        confinement: Confinement | None = None,
        checkpoint_sync_s: float = 5,
        shutdown_grace_s: float = 5,
        hangs: HangPolicy | None = None,
        output_rate: Callable[[], OutputRate | None] = lambda: None,
        disk_quota_gb: float | None = None,
        pin_cpus: bool = True,
        output_update_s: float = UPDATE_EVERY_S,
        fence: Fence | None = None,
        acknowledge: Acknowledge | None = None,
        retention: Retention | None = None,
        connected: Callable[[], bool] = lambda: True,
        secrets: Callable[[StartTask], Awaitable[dict[str, str]]] | None = None,
    ) -> None:
        self.node = node
        # Whether the bus connection is up: a heartbeat is not sent while it is not (the client would buffer it
        # and flush it at the reconnection, where the monitor would take the state it says as current).
        self.connected = connected
        self.retention = retention  # removes finished attempts' directories (None: they stay)
        # The attempt directories a previous run left, listed before this run launches any (two directory levels:
        # cheap), measured at the first sweep (None after it). Their tasks died with that run; the journal never
        # launches them again.
        self.left: list[Path] | None = attempt_dirs(retention.jobs) if retention is not None else None
        self.fence = fence  # stop every task when no heartbeat has been acknowledged for its window
        self.acknowledge = acknowledge
        self.launching: dict[str, asyncio.Task] = {}
        self.root = root
        self.publish = publish
        self.shutdown_grace_s = shutdown_grace_s
        self.hangs = hangs or HangPolicy()
        self.boot_id = uuid.uuid4().hex
        self.tasks: dict[str, TaskProcess] = {}
        self.supervisors: set[asyncio.Task] = set()
        private_dir(root)
        launches = private_dir(root / "launch")
        if left := clear_launches(launches):
            log.info("removed %d launch files an earlier run of the agent left", len(left))
        self.supervisor = Supervisor(
            node=node,
            root=root,
            launches=launches,
            boot_id=self.boot_id,
            checkpoints=checkpoints,
            preparer=preparer,
            storage=storage,
            confinement=confinement,
            checkpoint_sync_s=checkpoint_sync_s,
            hangs=self.hangs,
            output_rate=output_rate,
            disk_quota_gb=disk_quota_gb,
            pin_cpus=pin_cpus,
            output_update_s=output_update_s,
            publish=self.publish_reliably,
            report_exit=self._report_exit,
            finished=self._finished,
            tasks=self.tasks,
            launching=self.launching,
            secrets=secrets,
        )
        self.journal = Journal(root / "journal.json")
        self.sweeping = asyncio.Lock()  # retention's records and removals, one at a time
        self.heard_file = root / "silences.json"
        heard = load(self.heard_file) if fence is not None else None
        self.heard_saved: Heard | None = None  # what this run last wrote there
        if fence is not None and heard is not None:  # the node's silences go on from its previous run's
            fence.resume(silences=heard.silences, unheard_for_s=unheard_for_s(heard, now_wall=time.time()))
        self.heartbeats = 0
        self.stop_by: float | None = None  # monotonic: once stopping, when retries of what is unsent end

    def silences(self) -> int:
        """How often this node went unheard past its fence window (0 without a fence): what a start must carry."""
        if self.fence is None:
            return 0
        self.fence.due()
        return self.fence.silences

    async def come_up(self, loops: Callable[[], Awaitable[None]]) -> None:
        """Start the agent's loops (heartbeats), then register and report the ends an earlier run left. Not the
        other way round: a stream that does not take those yet (a NATS cluster electing its leaders) held back
        every heartbeat, and the node was lost for the silence of its own start. Nothing needs that order: the
        monitor reads heartbeats (core NATS) and registrations (a stream) apart, in any order, and a new boot id
        in either is the agent's restart."""
        await loops()
        await self.supervisor.ready()  # before the node is offered work: a first task's start pays no first claim
        await self.register()
        await self.report_unreported()

    async def register(self) -> None:
        await self.publish_reliably(
            NodeRegistered(
                event_id=f"{self.node.node_id}:boot:{self.boot_id}",
                node=self.node,
                boot_id=self.boot_id,
                silences=self.silences(),
            )
        )

    async def heartbeat(self) -> None:
        """Say which tasks run here and how each GPU is (NVML), then send each task's GPUs as its telemetry."""
        self.heartbeats += 1
        tasks = [t for t in self.tasks.values() if t.stop_reason != FENCED]  # fenced: dead or dying, not running
        listed = tasks[:MAX_RUNNING]  # what a heartbeat may list (a node running more says the first)
        running = tuple(TaskRef(job_id=t.start.job_id, attempt=t.start.attempt, rank=t.start.rank) for t in listed)
        probe = self.hangs.gpus
        indices = [g.index for g in self.node.gpus]
        # on a thread of its own: the shared pool may be full of a task's uploads, and a heartbeat waiting behind
        # them let the node go silent until it fenced every task (found by review)
        gpus = await asyncio.get_running_loop().run_in_executor(BEAT_THREAD, probe.read, indices) if probe else ()
        sent_at, sent_wall = (self.fence.clock() if self.fence else 0.0), time.time()
        if not self.connected():  # unsent, hence unacknowledged: the silence grows towards the fence as it should
            log.warning("heartbeat not sent: the bus is not connected")  # looked at last: a loss during the read
            return  # would have the client buffer it and send it, stale, at the reconnection
        await self.publish(
            NodeHeartbeat(
                event_id=f"{self.node.node_id}:{self.boot_id}:hb:{self.heartbeats}",
                node_id=self.node.node_id,
                boot_id=self.boot_id,
                running=running,
                gpus=gpus,
                silences=self.silences(),
            )
        )
        if self.fence is not None and self.acknowledge is not None:
            try:
                await self.acknowledge()
            except Exception as exc:  # the bus did not answer: the silence grows towards the fence
                log.warning("heartbeat not acknowledged, %.1f s since one was: %r", self.fence.silent_s(), exc)
                return
            self.fence.acked(sent_at)
            await self._keep_heard(self.fence, self.silences(), sent_wall)
        if not gpus or probe is None:
            return
        held = await asyncio.to_thread(
            lambda: [
                probe.process_memory_gb(
                    t.start.gpu_indices, group_pids(t.pid, cgroup=t.cgroup if t.in_cgroup() else None)
                )
                if t.start.gpu_indices
                else None
                for t in tasks
            ]
        )
        samples = task_samples(
            [(t.start, memory) for t, memory in zip(tasks, held)],
            gpus,
            node_id=self.node.node_id,
            seq=self.heartbeats,
            t=time.time(),
        )
        for failed in await asyncio.gather(*(self.publish(s) for s in samples), return_exceptions=True):
            if isinstance(failed, Exception):  # a sample lost; the next heartbeat sends another
                log.warning("GPU telemetry not sent: %r", failed)

    async def _keep_heard(self, fence: Fence, silences: int, acked_wall: float) -> None:
        """Write the count and the acknowledged heartbeat's time when the count changed or half the fence window
        passed since the time written (not at every heartbeat): a restart then takes the gap as at most that much
        longer than it was, which errs towards counting a silence."""
        saved, half_window = self.heard_saved, window_s(timeout_s=fence.timeout_s(), margin_s=fence.margin_s) / 2
        if (
            saved is not None
            and saved.acked_wall is not None
            and saved.silences == silences
            and acked_wall - saved.acked_wall < half_window
        ):
            return
        self.heard_saved = Heard(silences, acked_wall)
        await asyncio.to_thread(save, self.heard_file, self.heard_saved)

    async def start(self, command: StartTask) -> None:
        key = Journal.key(command.job_id, command.attempt, command.rank)
        if key in self.journal.stopped:
            return
        if key in self.journal.started:
            if key in self.tasks:  # redelivered after a failed report: report again (same event id)
                await self.publish(started_event(self.node, self.boot_id, self.tasks[key]))
            elif key not in self.launching and key not in self.journal.exited:
                # taken by an earlier run of this agent, which died with it
                await self._report_exit(
                    exited_event(
                        self.node,
                        command,
                        reason="terminated",
                        message="the agent restarted while this task ran",
                    )
                )
            return
        if self.fence is not None and self.fence.stale(command.silences):
            await self._refuse(key, command)
            return
        self.journal.mark_started(key)
        launch = asyncio.create_task(self.supervisor.launch(key, command))
        self.launching[key] = launch
        self.supervisors.add(launch)
        launch.add_done_callback(self.supervisors.discard)

    async def _refuse(self, key: str, command: StartTask) -> None:
        """A start issued before this node's latest silence: the monitor may have called the node lost and given
        the attempt to another since, and dropped the starts it knew were queued here; this one was delivered after
        that. It never runs; its end is reported, so an attempt still waiting for it goes back to the queue."""
        log.warning(
            "refused %s: issued before this node's silence %d (it carries %d)", key, self.silences(), command.silences
        )
        self.journal.mark_stopped(key)
        message = "refused: issued before this node last went unheard (it may have been declared lost)"
        await self._report_exit(exited_event(self.node, command, reason="terminated", message=message))

    async def stop(self, command: StopTask) -> None:
        key = Journal.key(command.job_id, command.attempt, command.rank)
        task = self.tasks.get(key)
        if task is not None:
            self._beside(task.stop(reason=command.reason, grace_s=command.grace_s))
        elif key in self.launching:
            self._cancel_launch(key)
        elif key not in self.journal.started and key not in self.journal.stopped:
            self.journal.mark_stopped(key)
            await self.publish_reliably(
                TaskExited(
                    event_id=f"{key}:exited",
                    job_id=command.job_id,
                    attempt=command.attempt,
                    rank=command.rank,
                    node_id=self.node.node_id,
                    reason="not_started",
                    message=f"stopped before start: {command.reason}",
                    ended_at=utcnow(),
                )
            )

    async def shutdown(self, reason: str = "agent_shutdown") -> None:
        """Stop every task (it is requeued elsewhere) and wait for their reports, until the stop's deadline: what
        the bus has not taken by then is not waited for (an end stays in the journal, for the next run)."""
        self.stop_by = time.monotonic() + self.shutdown_grace_s + SEND_AFTER_GRACE_S
        for key in list(self.launching):
            self._cancel_launch(key)
        for task in list(self.tasks.values()):
            self._beside(task.stop(reason=reason, grace_s=self.shutdown_grace_s))
        if self.supervisors:
            await asyncio.wait(self.supervisors, timeout=self.shutdown_grace_s + SEND_AFTER_GRACE_S)

    async def fence_if_unheard(self) -> None:
        """Stop every task (the stop command's path: SIGTERM, the fence's grace, SIGKILL, cleanup) once no heartbeat
        has been acknowledged for the fence's window: the monitor may soon call this node lost and place its jobs
        again. Their ends are reported when the bus answers again (journalled as fenced until then)."""
        fence = self.fence
        if fence is None or not fence.due():
            return
        for key, launch in list(self.launching.items()):
            if not launch.cancelling():  # cancelled once: it is reporting its end
                log.warning("fenced: %s stopped while preparing (%.1f s unacknowledged)", key, fence.silent_s())
                self.journal.mark_fenced(key)
                self._cancel_launch(key)
        for key, task in list(self.tasks.items()):  # those that ended and are not yet reported too: their
            if task.stop_reason is None:  # checkpoint and outputs, if not stored yet, are no longer theirs to write
                log.warning("fenced: stopping %s, no heartbeat acknowledged for %.1f s", key, fence.silent_s())
                self.journal.mark_fenced(key)
                self._beside(task.stop(reason=FENCED, grace_s=fence.grace_s))

    def _cancel_launch(self, key: str) -> None:
        """Cancel a task still preparing, once (a second cancel could cut its end report short); a launch
        cancelled before its first step reports its end through `_cancelled_unbegun`."""
        launch = self.launching[key]
        if launch.cancelling():
            return
        launch.cancel()
        launch.add_done_callback(functools.partial(self._cancelled_unbegun, key))

    def _beside(self, work: Coroutine[Any, Any, None]) -> None:
        """Run a stop beside the caller, held until it ends (a bare task may be collected before it runs)."""
        stop = asyncio.create_task(work)
        self.supervisors.add(stop)
        stop.add_done_callback(self.supervisors.discard)

    def _cancelled_unbegun(self, key: str, _launch: asyncio.Task) -> None:
        """A launch cancelled before it ran a step ends without its own report (nor forgetting itself): report
        it here, so the monitor hears its end all the same."""
        if self.launching.pop(key, None) is None:
            return
        job_id, attempt, rank = key.rsplit(":", 2)
        ref = TaskRef(job_id=job_id, attempt=int(attempt), rank=int(rank))
        report = asyncio.create_task(
            self._report_exit(exited_event(self.node, ref, reason="terminated", message="stopped while preparing"))
        )
        self.supervisors.add(report)
        report.add_done_callback(self.supervisors.discard)

    async def _finished(self, workdir: Path) -> None:
        """An attempt's end is reported (its output, checkpoint and outputs stored before): its directory is
        finished, kept for the retention within the budget."""
        if self.retention is not None:
            async with self.sweeping:
                await asyncio.to_thread(self.retention.ended, workdir)
            await self.sweep_attempts()

    async def sweep_attempts(self) -> None:
        """Remove the finished attempts' directories retention no longer keeps (and job directories left empty),
        the first time after taking what a previous run left as finished; one sweep at a time (each end and the
        periodic one), the retention's records touched by one thread."""
        if self.retention is not None:
            async with self.sweeping:
                if self.left is not None:  # the first: what a previous run left (measured in a thread: a long
                    await asyncio.to_thread(self.retention.adopt, self.left)  # walk holds back no heartbeat)
                    await asyncio.to_thread(forget_links, self.left)
                    self.left = None
                removed = await asyncio.to_thread(self.retention.sweep)
                remove_empty(path.parent for path in removed)  # in the loop: see retention.remove_empty

    async def report_unreported(self) -> None:
        """Report the end of tasks an earlier run of this agent started and died with (killed, power lost): their
        processes went with it, and without this no one would close those attempts (billing would charge them
        forever). They are reported ended now, an upper bound of when they stopped."""
        for job_id, attempt, rank in self.journal.unreported():
            key = Journal.key(job_id, attempt, rank)
            if key not in self.tasks and key not in self.launching:
                fenced = key in self.journal.fenced
                await self._report_exit(
                    exited_event(
                        self.node,
                        TaskRef(job_id=job_id, attempt=attempt, rank=rank),
                        reason="terminated",
                        message=f"stopped: {FENCED}" if fenced else "the agent restarted while this task ran",
                    )
                )

    async def _report_exit(self, event: TaskExited) -> None:
        """Report a task's end; journalled as reported once the bus took it (else the next run reports it)."""
        if await self._sent(event):
            self.journal.mark_exited(Journal.key(event.job_id, event.attempt, event.rank))

    async def publish_reliably(self, message: Message | LogChunk) -> None:
        """Publish, retrying while the bus is unreachable: a task's end must never be lost while the agent runs;
        once it stops, the retries end at the stop's deadline (`shutdown`)."""
        await self._sent(message)

    async def _sent(self, message: Message | LogChunk) -> bool:
        """Whether the bus took the message, retried each second until it does or the stop's deadline passed."""
        while True:
            try:
                await self.publish(message)
                return True
            except Exception as exc:
                left = None if self.stop_by is None else self.stop_by - time.monotonic()
                if left is not None and left <= 0:
                    log.warning(
                        "%s not sent: the agent stopped while the bus did not take it (%r)", message.event_id, exc
                    )
                    return False
                log.warning("publishing %s failed, retrying: %r", message.event_id, exc)
                await asyncio.sleep(1 if left is None else min(1, left))
