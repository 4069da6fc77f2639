"""A task's launch and supervision on its node: prepare (engine, code, inputs, checkpoint), start it confined, follow
it to its end (memory, disk, hangs, checkpoints and outputs), clean up and report how it ended."""

import asyncio
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from shared.clock import utcnow
from shared.events import LogChunk, Message, StartTask, TaskExited, TaskPreparing, TaskRef, TaskStarted
from shared.jobs import DataOut, task_cpus
from shared.nodes import NodeInfo
from shared.storage import StoragePolicy, check_segment, local_check, refused_urls
from services.agent import tmplink
from services.agent.cgroups import TaskCgroup, remove
from services.agent.checkpoints import ChangeWatch, CheckpointStore, Manifest, Mirror, TooManyFiles
from services.agent.cpus import CpuAllotment, host_cpus
from services.agent.fence import FENCED
from services.agent.gpudevices import others, visible
from services.agent.hangs import HangPolicy, watch
from services.agent.isolation import (
    KILLERS,
    Confinement,
    TaskUser,
    account_name,
    chown_tree,
    kill_user,
    private_dir,
)
from services.agent.jobsecrets import Masker
from services.agent.journal import Journal
from services.agent.outputrate import OutputRate
from services.agent.preparation import PrepareError, Preparer, output_dir
from services.agent.quota import enforce_disk, past_quota
from services.agent.runner import (
    TaskProcess,
    describe_exit,
    identity,
    job_variables,
    memory_limit_gb,
    spawn,
    task_environment,
)
from services.agent.shipping import LogShipper
from services.agent.spawner import SpawnerGone, spawner
from services.agent.taskenv import thread_defaults
from services.agent.transfers import Stalled, transfer, transfer_unless_stalled, unless_stalled

log = logging.getLogger(__name__)
T = TypeVar("T")

LOG_NAMES = frozenset({"output.log"})  # written by the agent into the attempt's directory: never the task's


@dataclass
class Supervisor:
    """Launches and supervises the agent's tasks: `tasks` and `launching` are the agent's own (shared)."""

    node: NodeInfo
    root: Path
    launches: Path  # the launch scripts' private directory
    boot_id: str
    checkpoints: CheckpointStore
    preparer: Preparer
    storage: StoragePolicy
    confinement: Confinement | None
    checkpoint_sync_s: float
    hangs: HangPolicy
    output_rate: Callable[[], OutputRate | None]  # each task's own allowance of output (None: unlimited)
    disk_quota_gb: float | None
    pin_cpus: bool  # each task pinned to its own CPUs (off: where it may run is the kernel's choice)
    output_update_s: float  # a redrawn bar's latest frame goes out at most this often
    publish: Callable[[Message | LogChunk], Awaitable[None]]  # reliably: retried while the bus is unreachable
    report_exit: Callable[[TaskExited], Awaitable[None]]  # a task's end, published and journalled
    finished: Callable[[Path], Awaitable[None]]  # an attempt's directory once its end is reported
    tasks: dict[str, TaskProcess]
    launching: dict[str, asyncio.Task]
    besides: set[asyncio.Task] = field(default_factory=set)  # work beside the tasks (a uid claimed ahead)
    tmp_links: dict[Path, Path] = field(default_factory=dict)  # a running attempt's TMPDIR link by its directory
    # a task's secrets, asked of the submitter (`jobsecrets.fetch`); None: a job with secrets cannot start here
    secrets: Callable[[StartTask], Awaitable[dict[str, str]]] | None = None
    cpus: CpuAllotment = field(init=False)  # the host CPUs each task is pinned to (`spec.resource.cpu_count`)

    def __post_init__(self) -> None:
        self.cpus = CpuAllotment(host_cpus(), node_id=self.node.node_id)

    async def ready(self) -> None:
        """What a task's first start would otherwise wait for, done now: the shim server and the killer started and
        a task uid claimed ahead (a fresh range's first claim looks through every process of the host)."""
        try:
            await spawner().warm()
        except SpawnerGone as exc:  # a task's own start meets it again (and starts its shim on its own)
            log.warning("%s", exc)
        if self.confinement is None or self.confinement.users is None:
            return
        try:
            await asyncio.to_thread(KILLERS.warm)
            await asyncio.to_thread(self.confinement.users.ready_one)
        except Exception as exc:  # a task's own claim meets it again, and fails that task alone
            log.warning("could not claim a task uid ahead: %r", exc)

    def _beside(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self.besides.add(task)
        task.add_done_callback(self.besides.discard)

    async def launch(self, key: str, command: StartTask) -> None:
        """Prepare (engine, code, inputs, checkpoint), start, then follow the task to its end; its CPUs are given
        back once its processes are gone, and however it fails to start."""
        try:
            await self._launch(key, command)
        finally:
            self.cpus.give_back(key)

    async def _launch(self, key: str, command: StartTask) -> None:
        job_dir = private_dir(self.root / "jobs" / check_segment(command.job_id))
        workdir = job_dir / f"attempt-{command.attempt}-rank-{command.rank}"
        workdir.mkdir(mode=0o700, exist_ok=True)
        shipper = LogShipper(
            job_id=command.job_id,
            attempt=command.attempt,
            rank=command.rank,
            node_id=self.node.node_id,
            path=workdir / "output.log",
            publish=self.publish,
            rate=self.output_rate(),
        )
        note = shipper.note
        user = cgroup = None
        try:
            refused = refused_urls(command.algorithm, policy=self.storage, project_id=command.project_id)
            if refused:  # the submitter refuses these too; a command that reaches us anyway does not run
                raise PrepareError("; ".join(f"{field}: {reason}" for field, reason in refused))
            if self.preparer.needs_work(command) or command.algorithm.secret_names:
                await self.publish(
                    TaskPreparing(
                        event_id=f"{key}:preparing",
                        job_id=command.job_id,
                        attempt=command.attempt,
                        rank=command.rank,
                        node_id=self.node.node_id,
                    )
                )
            values = await self._secrets(command)  # before any work: a refusal is known at once
            env = task_environment(command, self.node, workdir=workdir, base=dict(os.environ))
            argv = await self.preparer.prepare(command, workdir, env, note)
            masker = Masker(values.values())
            shipper.mask = masker or None
            try:
                manifest = await transfer_unless_stalled(
                    partial(self.checkpoints.restore, command.project_id, command.job_id, workdir / "checkpoint"),
                    project=command.project_id,
                )
            except Stalled as exc:  # the attempt fails to start, said why, not waits for ever
                raise PrepareError(f"its checkpoint could not be restored: {exc}") from None
            (workdir / "tmp").mkdir(exist_ok=True)
            link = await asyncio.to_thread(tmplink.make, workdir / "tmp")
            if link is not None:  # a short TMPDIR: Unix sockets under it fit (services/agent/tmplink.py)
                self.tmp_links[workdir] = link
                env["TMPDIR"] = str(link)
            reach, cover, tmpfs = [str(workdir)], None, None
            cpu_count = task_cpus(
                command.spec.resource.cpu_count,
                gpus=len(command.gpu_indices),
                node_cpus=self.node.cpu_count,
                node_gpus=len(self.node.gpus),
            )
            cpus = self.cpus.take(key, cpu_count) if self.pin_cpus else ()
            limit = min(cpu_count, len(cpus or self.cpus.order))  # no more than the CPUs it may run on
            env.update(thread_defaults(job_variables(command), cpus=math.ceil(limit), pinned=bool(cpus)))
            hidden: list[str] = []
            if (rules := self.confinement) is not None and rules.gpu_files:
                # the others hidden, the driver may number only its own: named by UUID, or none hidden where a GPU
                # of its has no UUID known (its index would then name another)
                if by_uuid := visible(rules.gpu_files, command.gpu_indices):
                    env["CUDA_VISIBLE_DEVICES"] = by_uuid
                if by_uuid or not command.gpu_indices:
                    hidden = others(rules.gpu_files, command.gpu_indices)
            if rules is not None:
                # the engine the preparation set up (its VIRTUAL_ENV), never a variable the job set itself: that
                # opened any folder it named, another project's storage under the covered data directory included
                engine = [env["VIRTUAL_ENV"]] if self.preparer.engine_of(command) is not None else []
                reach, cover, tmpfs = [*rules.reach, str(workdir), *engine], rules.cover, rules.tmpfs_bytes
            if rules is not None and rules.users is not None:  # else the agent's own user, in namespaces of its own
                if self.besides:  # a uid being claimed ahead (a task just ended): this claim takes it, no second look
                    await asyncio.wait(set(self.besides))
                user = await asyncio.to_thread(rules.users.claim)
                env.update(identity(account_name(user.uid), workdir))
                await asyncio.to_thread(chown_tree, workdir, uid=user.uid, gid=user.gid, skip=LOG_NAMES)
                if rules.cgroups is not None:
                    cgroup = await asyncio.to_thread(
                        rules.cgroups.create,
                        name=f"uid-{user.uid}",
                        memory_gb=memory_limit_gb(command, self.node),
                        cpu_count=limit,
                    )
            quota = self.disk_quota_gb
            # the task's alone (not the preparation's: its packages' installs), and never over a variable the agent
            # or the preparation set (a secret named VIRTUAL_ENV would name the folder a confined task may reach)
            if shadowed := sorted(set(values) & set(env)):
                raise PrepareError(f"secrets: {shadowed[0]!r} is set by trainmaster for every task: name it otherwise")
            task = await spawn(
                command,
                env={**env, **values},
                workdir=workdir,
                argv=argv,
                launch_dir=self.launches,
                cpus=cpus,
                user=user,
                reach=reach,
                cover=cover,
                cgroup=cgroup,
                tmpfs_bytes=tmpfs,
                # /dev/shm as large as the task's memory (a DataLoader's batches pass through it): the shim
                # applies it only where the task joined its cgroup, which counts it
                shm_bytes=max(tmpfs, int(memory_limit_gb(command, self.node) * 2**30)) if tmpfs else None,
                file_size=int(quota * 2**30) if quota else None,
                links={env["TMPDIR"]: str(workdir / "tmp")} if link is not None else None,
                hidden=hidden,
            )
            task.update_every_s = self.output_update_s
            task.note = note
            task.tail.mask = masker or None  # before its output is read (`_supervise`); no cut of a line splits one
        except asyncio.CancelledError:
            await self._give_back(workdir, user, cgroup)
            await shipper.close()
            await self.report_exit(
                exited_event(self.node, command, reason="terminated", message="stopped while preparing")
            )
            await self.finished(workdir)
            return
        except Exception as exc:  # environment, code, inputs or storage: the attempt cannot start
            await self._give_back(workdir, user, cgroup)
            message = str(exc) if isinstance(exc, PrepareError) else repr(exc)
            note(f"could not start: {message}")
            await shipper.close()
            await self.report_exit(exited_event(self.node, command, reason="start_failed", message=message))
            await self.finished(workdir)
            return
        finally:
            self.launching.pop(key, None)
        task.manifest = manifest
        self.tasks[key] = task
        await self.publish(started_event(self.node, self.boot_id, task))
        await self._supervise(key, task, shipper)

    async def _supervise(self, key: str, task: TaskProcess, shipper: LogShipper) -> None:
        start = task.start
        helpers = [
            asyncio.create_task(task.enforce_memory(memory_limit_gb(start, self.node))),
            asyncio.create_task(self._sync_checkpoints(task)),
            asyncio.create_task(watch(task, node_id=self.node.node_id, policy=self.hangs, publish=self.publish)),
            *[
                asyncio.create_task(self._upload_periodically(task, o))
                for o in start.algorithm.outputs
                if o.mode == "upload_periodically"
            ],
        ]
        if self.disk_quota_gb:
            helpers.append(asyncio.create_task(enforce_disk(task, self.disk_quota_gb)))
        status = await task.pump(shipper.add, gate=shipper)
        self.cpus.give_back(key)  # its processes are gone: the next task may have its CPUs while its end is reported
        for helper in helpers:
            helper.cancel()
        task.out_of_memory(memory_limit_gb(start, self.node))  # the kernel may have been quicker than our last look
        if self.disk_quota_gb and not task.disk_full:  # written past it since the last look: it fails all the same
            await past_quota(task, self.disk_quota_gb)
        outlived = 0
        if task.user is not None and not task.held_by_cgroup():  # what the task left running under its uid
            # (detached on purpose or not); its cgroup's are dead
            outlived = await asyncio.to_thread(kill_user, task.user.uid)
        task.note = None  # its output ends here (a folder found unsaved from now on: said in its end's message)
        # (its shim has ended); a process of its uid alive after it ran outside its namespaces: the whole sweep
        isolated = task.ran_isolated() and not outlived
        if task.stop_reason == FENCED:  # cleaned up at once; its last output waits for the bus, its storage is left
            await self._give_back(task.workdir, task.user, task.cgroup, isolated=isolated)
            await shipper.close()
        else:
            await shipper.close()
            await self._save_last(task)
            await self._give_back(task.workdir, task.user, task.cgroup, isolated=isolated)
        oom = None
        if task.stop_reason is not None:  # (a move or a stop: the next attempt resumes from what was saved)
            reason, message = "terminated", "; ".join(filter(None, [f"stopped: {task.stop_reason}", unsaved(task)]))
        elif task.disk_full:
            reason, message = "failed", describe_exit(status, task.tail)
        elif status == 0:
            reason, message = "completed", unsaved(task)
        elif task.oom:
            reason, message, oom = "oom", describe_exit(status, task.tail), task.oom
        else:
            reason, message = "failed", describe_exit(status, task.tail)
        if shipper.mask is not None:  # its output's tail: masked as its output was
            message = shipper.mask(message)
        await self.report_exit(exited_event(self.node, start, reason=reason, message=message, status=status, oom=oom))
        self.tasks.pop(key, None)
        await self.finished(task.workdir)

    async def _secrets(self, command: StartTask) -> dict[str, str]:
        if not command.algorithm.secret_names:
            return {}
        if self.secrets is None:
            raise PrepareError("secrets: this agent does not ask for a job's secrets")
        return await self.secrets(command)

    async def _give_back(
        self, workdir: Path, user: TaskUser | None, cgroup: TaskCgroup | None, *, isolated: bool = False
    ) -> None:
        """Release the task's uid (`_release`), then claim the next start's uid ahead beside: the lowest free, so
        most often the one just given back, which needs no look."""
        try:
            await asyncio.to_thread(self._release, workdir, user, cgroup, isolated=isolated)
        except Exception:  # the task's end is reported whatever its release met; its uid looked for at its claim
            log.exception("giving back the task in %s failed", workdir)
        if user is not None:
            self._beside(self.ready())

    def _release(
        self, workdir: Path, user: TaskUser | None, cgroup: TaskCgroup | None = None, *, isolated: bool = False
    ) -> None:
        """Give the task's uid back, its processes killed, its cgroup removed and its files the agent's again; its
        TMPDIR link removed."""
        tmplink.remove(self.tmp_links.pop(workdir, tmplink.link_name(workdir / "tmp")), workdir / "tmp")
        users = self.confinement.users if self.confinement is not None else None
        if user is not None and users is not None:  # a task user: claimed from the confinement's
            users.release(user, workdir=workdir, cgroup=cgroup, isolated=isolated)
        elif cgroup is not None:
            remove(cgroup)

    async def _save_last(self, task: TaskProcess) -> None:
        """The task's last copies at its end (completed, failed, terminated or moved): its checkpoint, then each
        output. One whose storage moved nothing for `STALL_S` is given up, and every copy after it (its thread
        still holds the task's turn): named unsaved in the end's message, the end reported all the same."""
        saves = [("checkpoint", partial(self._sync_once, task, last=True))] + [
            (f"output {output.name}", partial(self._upload, task, output, last=True))
            for output in task.start.algorithm.outputs
        ]
        stalled: str | None = None
        for folder, save in saves:
            if stalled is not None:
                unmirrored(task, folder, Stalled(f"{folder}: not copied, the copy of {stalled} before it hangs"))
                continue
            try:
                await unless_stalled(save(), task.copying)
            except Stalled as exc:
                stalled = folder
                unmirrored(task, folder, Stalled(f"{folder}: {exc}"))

    async def _upload_periodically(self, task: TaskProcess, output: DataOut) -> None:
        while True:
            await asyncio.sleep(output.period_s)
            await self._upload(task, output)

    async def _upload(self, task: TaskProcess, output: DataOut, *, last: bool = False) -> None:
        """Copy what the output directory holds to its URL (never deleting what earlier attempts left there)."""
        check = local_check(self.storage, task.start.project_id)

        def keep(copied: Manifest) -> None:
            task.uploaded[output.name] = copied

        await self._mirror(
            task,
            f"output {output.name}",
            lambda: Mirror(output.url, check=check).sync(
                output_dir(task.workdir, output), task.uploaded.get(output.name, {}), delete=False, anchor=task.workdir
            ),
            keep=keep,
            last=last,
        )

    async def _sync_checkpoints(self, task: TaskProcess) -> None:
        """Mirror the checkpoint directory when a file in it is complete, and every checkpoint_sync_s anyway."""
        with ChangeWatch(task.workdir / "checkpoint") as changes:
            while True:
                await changes.wait(self.checkpoint_sync_s)
                await self._sync_once(task)

    async def _sync_once(self, task: TaskProcess, *, last: bool = False) -> None:
        start = task.start

        def keep(copied: Manifest) -> None:
            task.manifest = copied

        await self._mirror(
            task,
            "checkpoint",
            partial(
                self.checkpoints.sync,
                start.project_id,
                start.job_id,
                task.workdir / "checkpoint",
                task.manifest,
                task.workdir,
            ),
            keep=keep,
            last=last,
        )

    async def _mirror(
        self, task: TaskProcess, folder: str, copy: Callable[[], T], *, keep: Callable[[T], None], last: bool
    ) -> None:
        """One of the task's folders copied to storage (`copy`, on a transfer thread, one copy of the task at a
        time), what it returns kept (`keep`) before it is said copied; nothing where it is not due, found holding
        too many files (said so) or the storage fails (the next copy tries again). A copy given up as stalled
        (`Stalled`) is its caller's to say. Nothing once the task is fenced: its next attempt may already run
        elsewhere, and that one writes."""
        if task.stop_reason == FENCED or not due(task, folder, last=last):
            return
        try:
            keep(await transfer(copy, project=task.start.project_id, lock=task.transferring, progress=task.copying))
            mirrored(task, folder)
        except TooManyFiles as exc:
            unmirrored(task, folder, exc)
        except Stalled:
            raise
        except Exception as exc:  # a storage hiccup: the next copy tries again
            log.warning("copying %s of %s failed: %r", folder, task.start.job_id, exc)


UNMIRRORED_RETRY_S = 60.0  # a folder found holding too many files is looked at again this long after (and at the end)


def due(task: TaskProcess, folder: str, *, last: bool) -> bool:
    """Whether a folder of the task is copied now: always at the task's end; otherwise unless it was found holding
    too many files within `UNMIRRORED_RETRY_S` (each look walks up to the cap, and a change could ask 4 times a
    second)."""
    found = task.unmirrored.get(folder)
    return last or found is None or time.monotonic() - found[0] >= UNMIRRORED_RETRY_S


def unmirrored(task: TaskProcess, folder: str, exc: TooManyFiles | Stalled) -> None:
    """A folder of the task holds too many files to be mirrored, or its storage hangs: said in its output where it
    was not already (and in its end's message, `unsaved`), looked at again later."""
    if folder not in task.unmirrored:
        said = f"the {folder} folder is not saved: {exc}"
        task.tail.append(f"[trainmaster] {said}")
        if task.note is not None:
            task.note(said)
        log.warning("%s of %s not mirrored: %s", folder, task.start.job_id, exc)
    task.unmirrored[folder] = (time.monotonic(), str(exc))


def mirrored(task: TaskProcess, folder: str) -> None:
    if task.unmirrored.pop(folder, None) is not None and task.note is not None:
        task.note(f"the {folder} folder is saved again")


def unsaved(task: TaskProcess) -> str:
    """What its end's message says of folders left unsaved, and why (none: empty)."""
    if not task.unmirrored:
        return ""
    return "not saved: " + "; ".join(why for _, (_, why) in sorted(task.unmirrored.items()))


def started_event(node: NodeInfo, boot_id: str, task: TaskProcess) -> TaskStarted:
    """What the agent (run `boot_id`) says of a task it started."""
    start = task.start
    return TaskStarted(
        event_id=f"{Journal.key(start.job_id, start.attempt, start.rank)}:started",
        job_id=start.job_id,
        attempt=start.attempt,
        rank=start.rank,
        node_id=node.node_id,
        node_kind=node.kind,
        price_per_hour=node.price_per_hour,
        gpu_count=len(start.gpu_indices),
        node_gpu_count=len(node.gpus),
        boot_id=boot_id,
        gpu_model=next((g.model for g in node.gpus if g.index in start.gpu_indices), ""),
        world_size=start.world_size,
        project_id=start.project_id,
        user_name=start.user_name,
        pid=task.pid,
        started_at=datetime.fromtimestamp(task.started_at, UTC),
    )


def exited_event(
    node: NodeInfo,
    start: StartTask | TaskRef,
    *,
    reason: str,
    message: str,
    status: int | None = None,
    oom: str | None = None,
) -> TaskExited:
    """How a task ended, as its node's agent says (`status`: its exit status, negative for a signal)."""
    return TaskExited(
        event_id=f"{Journal.key(start.job_id, start.attempt, start.rank)}:exited",
        job_id=start.job_id,
        attempt=start.attempt,
        rank=start.rank,
        node_id=node.node_id,
        exit_code=None if status is None else (status if status >= 0 else 128 - status),
        signal=-status if status is not None and status < 0 else None,
        reason=reason,
        oom=oom,
        message=message,
        ended_at=utcnow(),
    )
