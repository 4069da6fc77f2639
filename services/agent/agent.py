"""The node agent's behaviour: register, heartbeat, start and stop tasks, report how they end."""

import asyncio
import functools
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shared.clock import utcnow
from shared.events import (
    LogChunk,
    Message,
    NodeHeartbeat,
    NodeRegistered,
    StartTask,
    StopTask,
    TaskExited,
    TaskPreparing,
    TaskRef,
    TaskStarted,
)
from shared.jobs import DataOut
from shared.nodes import NodeInfo
from shared.storage import StoragePolicy, check_segment, refused_urls
from services.agent.carriage import UPDATE_EVERY_S
from services.agent.cgroups import TaskCgroup, remove
from services.agent.checkpoints import ChangeWatch, CheckpointStore, Mirror
from services.agent.fence import FENCED, Fence, window_s
from services.agent.hangs import HangPolicy, watch
from services.agent.isolation import Confinement, TaskUser, account_name, chown_tree, kill_user, private_dir
from services.agent.journal import Journal
from services.agent.outputrate import OutputRate
from services.agent.preparation import PrepareError, Preparer, output_dir
from services.agent.quota import enforce_disk, past_quota
from services.agent.retention import Retention, remove_empty
from services.agent.runner import TaskProcess, describe_exit, identity, memory_limit_gb, spawn, task_environment
from services.agent.shipping import LogShipper
from services.agent.silences import Heard, load, save, unheard_for_s
from services.agent.telemetry import group_pids, task_samples

log = logging.getLogger(__name__)

Publish = Callable[[Message], Awaitable[None]]
Acknowledge = Callable[[], Awaitable[None]]  # returns once the server has everything published so far, else raises
LOG_NAMES = frozenset({"output.log"})  # written by the agent into the attempt's directory: never the task's


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
        output_update_s: float = UPDATE_EVERY_S,
        fence: Fence | None = None,
        acknowledge: Acknowledge | None = None,
        retention: Retention | None = None,
        connected: Callable[[], bool] = lambda: True,
    ) -> None:
        self.node = node
        # Whether the bus connection is up: a heartbeat is not sent while it is not (the client would buffer it
        # and flush it at the reconnection, where the monitor would take the state it says as current).
        self.connected = connected
        self.retention = retention  # removes finished attempts' directories (None: they stay)
        self.adopted = False  # what a previous run left is taken as finished at the first sweep, not here
        self.attempt_dirs: set[Path] = set()  # this run's attempts' directories: never a previous run's
        self.fence = fence  # stop every task when no heartbeat has been acknowledged for its window
        self.acknowledge = acknowledge
        self.output_update_s = output_update_s  # a redrawn bar's latest frame goes out at most this often
        self.output_rate = output_rate  # each task's own allowance of output (None: unlimited)
        self.disk_quota_gb = disk_quota_gb
        self.storage = storage
        self.confinement = confinement
        self.preparer = preparer
        self.launching: dict[str, asyncio.Task] = {}
        self.checkpoints = checkpoints
        self.checkpoint_sync_s = checkpoint_sync_s
        self.root = root
        self.publish = publish
        self.shutdown_grace_s = shutdown_grace_s
        self.hangs = hangs or HangPolicy()
        self.boot_id = uuid.uuid4().hex
        self.tasks: dict[str, TaskProcess] = {}
        self.supervisors: set[asyncio.Task] = set()
        private_dir(root)
        self.launches = private_dir(root / "launch")
        self.journal = Journal(root / "journal.json")
        self.sweeping = asyncio.Lock()  # retention's records and removals, one at a time
        self.heard_file = root / "silences.json"
        heard = load(self.heard_file) if fence is not None else None
        self.heard_saved: Heard | None = None  # what this run last wrote there
        if fence is not None and heard is not None:  # the node's silences go on from its previous run's
            fence.resume(silences=heard.silences, unheard_for_s=unheard_for_s(heard, now_wall=time.time()))
        self.heartbeats = 0

    def silences(self) -> int:
        """How often this node went unheard past its fence window (0 without a fence): what a start must carry."""
        if self.fence is None:
            return 0
        self.fence.due()
        return self.fence.silences

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
        if not self.connected():  # unsent, hence unacknowledged: the silence grows towards the fence as it should
            log.warning("heartbeat not sent: the bus is not connected")
            return
        tasks = [t for t in self.tasks.values() if t.stop_reason != FENCED]  # fenced: dead or dying, not running
        running = tuple(TaskRef(job_id=t.start.job_id, attempt=t.start.attempt, rank=t.start.rank) for t in tasks)
        probe = self.hangs.gpus
        gpus = await asyncio.to_thread(probe.read, [g.index for g in self.node.gpus]) if probe else ()
        sent_at, sent_wall = (self.fence.clock() if self.fence else 0.0), time.time()
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
                probe.process_memory_gb(t.start.gpu_indices, group_pids(t.pid)) if t.start.gpu_indices else None
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
                await self.publish(self._started_event(self.tasks[key]))
            elif key not in self.launching and key not in self.journal.exited:
                # taken by an earlier run of this agent, which died with it
                await self._report_exit(
                    self._exited(command, reason="terminated", message="the agent restarted while this task ran")
                )
            return
        if self.fence is not None and self.fence.stale(command.silences):
            await self._refuse(key, command)
            return
        self.journal.mark_started(key)
        launch = asyncio.create_task(self._launch(key, command))
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
        await self._report_exit(self._exited(command, reason="terminated", message=message))

    async def _launch(self, key: str, command: StartTask) -> None:
        """Prepare (engine, code, inputs, checkpoint), start, then follow the task to its end."""
        job_dir = private_dir(self.root / "jobs" / check_segment(command.job_id))
        workdir = job_dir / f"attempt-{command.attempt}-rank-{command.rank}"
        if not self.adopted:  # before it exists: the sweep adopting a previous run's directories never takes it
            self.attempt_dirs.add(workdir)
        workdir.mkdir(mode=0o700, exist_ok=True)
        shipper = LogShipper(
            job_id=command.job_id,
            attempt=command.attempt,
            rank=command.rank,
            node_id=self.node.node_id,
            path=workdir / "output.log",
            publish=self.publish_reliably,
            rate=self.output_rate(),
        )
        note = shipper.note
        user = cgroup = None
        try:
            refused = refused_urls(command.algorithm, policy=self.storage, project_id=command.project_id)
            if refused:  # the submitter refuses these too; a command that reaches us anyway does not run
                raise PrepareError("; ".join(f"{field}: {reason}" for field, reason in refused))
            if self.preparer.needs_work(command):
                await self.publish_reliably(
                    TaskPreparing(
                        event_id=f"{key}:preparing",
                        job_id=command.job_id,
                        attempt=command.attempt,
                        rank=command.rank,
                        node_id=self.node.node_id,
                    )
                )
            env = task_environment(command, self.node, workdir=workdir, base=dict(os.environ))
            argv = await self.preparer.prepare(command, workdir, env, note)
            manifest = await asyncio.to_thread(
                self.checkpoints.restore, command.project_id, command.job_id, workdir / "checkpoint"
            )
            (workdir / "tmp").mkdir(exist_ok=True)
            reach, cover, tmpfs = [str(workdir)], None, None
            if self.confinement is not None:
                rules = self.confinement
                user = await asyncio.to_thread(rules.users.claim)
                env.update(identity(account_name(user.uid), workdir))
                await asyncio.to_thread(chown_tree, workdir, uid=user.uid, gid=user.gid, skip=LOG_NAMES)
                engine = [env["VIRTUAL_ENV"]] if "VIRTUAL_ENV" in env else []
                reach, cover, tmpfs = [*rules.reach, str(workdir), *engine], rules.cover, rules.tmpfs_bytes
                if rules.cgroups is not None:
                    cgroup = await asyncio.to_thread(
                        rules.cgroups.create, name=f"uid-{user.uid}", memory_gb=memory_limit_gb(command, self.node)
                    )
            quota = self.disk_quota_gb
            task = await spawn(
                command,
                env=env,
                workdir=workdir,
                argv=argv,
                launch_dir=self.launches,
                user=user,
                reach=reach,
                cover=cover,
                cgroup=cgroup,
                tmpfs_bytes=tmpfs,
                file_size=int(quota * 2**30) if quota else None,
            )
            task.update_every_s = self.output_update_s
        except asyncio.CancelledError:
            await asyncio.to_thread(self._release, workdir, user, cgroup)
            await shipper.close()
            await self._report_exit(self._exited(command, reason="terminated", message="stopped while preparing"))
            await self._finished(workdir)
            return
        except Exception as exc:  # environment, code, inputs or storage: the attempt cannot start
            await asyncio.to_thread(self._release, workdir, user, cgroup)
            message = str(exc) if isinstance(exc, PrepareError) else repr(exc)
            note(f"could not start: {message}")
            await shipper.close()
            await self._report_exit(self._exited(command, reason="start_failed", message=message))
            await self._finished(workdir)
            return
        finally:
            self.launching.pop(key, None)
        task.manifest = manifest
        self.tasks[key] = task
        await self.publish_reliably(self._started_event(task))
        await self._supervise(key, task, shipper)

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
        """Stop every task (it is requeued elsewhere) and wait for their reports."""
        for key in list(self.launching):
            self._cancel_launch(key)
        for task in list(self.tasks.values()):
            self._beside(task.stop(reason=reason, grace_s=self.shutdown_grace_s))
        if self.supervisors:
            await asyncio.wait(self.supervisors, timeout=self.shutdown_grace_s + 5)

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
            self._report_exit(self._exited(ref, reason="terminated", message="stopped while preparing"))
        )
        self.supervisors.add(report)
        report.add_done_callback(self.supervisors.discard)

    async def _supervise(self, key: str, task: TaskProcess, shipper: LogShipper) -> None:
        start = task.start
        helpers = [
            asyncio.create_task(task.enforce_memory(memory_limit_gb(start, self.node))),
            asyncio.create_task(self._sync_checkpoints(task)),
            asyncio.create_task(
                watch(task, node_id=self.node.node_id, policy=self.hangs, publish=self.publish_reliably)
            ),
            *[
                asyncio.create_task(self._upload_periodically(task, o))
                for o in start.algorithm.outputs
                if o.mode == "upload_periodically"
            ],
        ]
        if self.disk_quota_gb:
            helpers.append(asyncio.create_task(enforce_disk(task, self.disk_quota_gb)))
        status = await task.pump(shipper.add)
        for helper in helpers:
            helper.cancel()
        task.out_of_memory(memory_limit_gb(start, self.node))  # the kernel may have been quicker than our last look
        if self.disk_quota_gb and not task.disk_full:  # written past it since the last look: it fails all the same
            await past_quota(task, self.disk_quota_gb)
        if task.user is not None:  # what the task left running under its uid (detached on purpose or not)
            await asyncio.to_thread(kill_user, task.user.uid)
        if task.stop_reason == FENCED:  # cleaned up at once; its last output waits for the bus, its storage is left
            await asyncio.to_thread(self._release, task.workdir, task.user, task.cgroup)
            await shipper.close()
        else:
            await shipper.close()
            await self._sync_once(task)
            for output in start.algorithm.outputs:  # every attempt's end: completed, failed, terminated or moved
                await self._upload(task, output)
            await asyncio.to_thread(self._release, task.workdir, task.user, task.cgroup)
        oom = None
        if task.stop_reason is not None:
            reason, message = "terminated", f"stopped: {task.stop_reason}"
        elif task.disk_full:
            reason, message = "failed", describe_exit(status, task.tail)
        elif status == 0:
            reason, message = "completed", ""
        elif task.oom:
            reason, message, oom = "oom", describe_exit(status, task.tail), task.oom
        else:
            reason, message = "failed", describe_exit(status, task.tail)
        await self._report_exit(self._exited(start, reason=reason, message=message, status=status, oom=oom))
        self.tasks.pop(key, None)
        await self._finished(task.workdir)

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
                if not self.adopted:  # the first: what a previous run left (in a thread: a long walk holds no beat)
                    await asyncio.to_thread(self.retention.adopt, self.attempt_dirs)
                    self.adopted, self.attempt_dirs = True, set()
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
                    self._exited(
                        TaskRef(job_id=job_id, attempt=attempt, rank=rank),
                        reason="terminated",
                        message=f"stopped: {FENCED}" if fenced else "the agent restarted while this task ran",
                    )
                )

    def _release(self, workdir: Path, user: TaskUser | None, cgroup: TaskCgroup | None = None) -> None:
        """Give the task's uid back, its processes killed, its cgroup removed and its files the agent's again."""
        if cgroup is not None:
            remove(cgroup)
        if user is None or self.confinement is None:  # a task user comes only with confinement
            return
        kill_user(user.uid)
        chown_tree(workdir, uid=os.geteuid(), gid=os.getegid())
        self.confinement.users.release(user)

    async def _report_exit(self, event: TaskExited) -> None:
        await self.publish_reliably(event)
        self.journal.mark_exited(Journal.key(event.job_id, event.attempt, event.rank))

    async def _upload_periodically(self, task: TaskProcess, output: DataOut) -> None:
        while True:
            await asyncio.sleep(output.period_s)
            await self._upload(task, output)

    async def _upload(self, task: TaskProcess, output: DataOut) -> None:
        """Copy what the output directory holds to its URL (never deleting what earlier attempts left there)."""
        if task.stop_reason == FENCED:  # its attempt may already run elsewhere: that one writes, not this
            return
        try:
            task.uploaded[output.name] = await asyncio.to_thread(
                Mirror(output.url).sync,
                output_dir(task.workdir, output),
                task.uploaded.get(output.name, {}),
                delete=False,
                anchor=task.workdir,
            )
        except Exception as exc:
            log.warning("uploading output %s of %s failed: %r", output.name, task.start.job_id, exc)

    async def _sync_checkpoints(self, task: TaskProcess) -> None:
        """Mirror the checkpoint directory when a file in it is complete, and every checkpoint_sync_s anyway."""
        with ChangeWatch(task.workdir / "checkpoint") as changes:
            while True:
                await changes.wait(self.checkpoint_sync_s)
                await self._sync_once(task)

    async def _sync_once(self, task: TaskProcess) -> None:
        if task.stop_reason == FENCED:  # the next attempt may have restored the checkpoint: it is its writer now
            return
        try:
            task.manifest = await asyncio.to_thread(
                self.checkpoints.sync,
                task.start.project_id,
                task.start.job_id,
                task.workdir / "checkpoint",
                task.manifest,
                task.workdir,
            )
        except Exception as exc:  # storage hiccup: the next sync tries again
            log.warning("checkpoint sync of %s failed: %r", task.start.job_id, exc)

    def _started_event(self, task: TaskProcess) -> TaskStarted:
        start = task.start
        return TaskStarted(
            event_id=f"{Journal.key(start.job_id, start.attempt, start.rank)}:started",
            job_id=start.job_id,
            attempt=start.attempt,
            rank=start.rank,
            node_id=self.node.node_id,
            node_kind=self.node.kind,
            price_per_hour=self.node.price_per_hour,
            gpu_count=len(start.gpu_indices),
            node_gpu_count=len(self.node.gpus),
            boot_id=self.boot_id,
            gpu_model=next((g.model for g in self.node.gpus if g.index in start.gpu_indices), ""),
            world_size=start.world_size,
            project_id=start.project_id,
            user_name=start.user_name,
            pid=task.pid,
            started_at=datetime.fromtimestamp(task.started_at, UTC),
        )

    def _exited(
        self,
        start: StartTask | TaskRef,
        *,
        reason: str,
        message: str,
        status: int | None = None,
        oom: str | None = None,
    ) -> TaskExited:
        return TaskExited(
            event_id=f"{Journal.key(start.job_id, start.attempt, start.rank)}:exited",
            job_id=start.job_id,
            attempt=start.attempt,
            rank=start.rank,
            node_id=self.node.node_id,
            exit_code=None if status is None else (status if status >= 0 else 128 - status),
            signal=-status if status is not None and status < 0 else None,
            reason=reason,
            oom=oom,
            message=message,
            ended_at=utcnow(),
        )

    async def publish_reliably(self, message: Message | LogChunk) -> None:
        """Publish, retrying while the bus is unreachable: a task's end must never be lost."""
        while True:
            try:
                await self.publish(message)
                return
            except Exception as exc:
                log.warning("publishing %s failed, retrying: %r", message.event_id, exc)
                await asyncio.sleep(1)
