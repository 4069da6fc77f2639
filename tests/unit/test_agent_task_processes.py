"""Where a root agent finds a task's processes: in the task's cgroup when the shim joined it (no look through every
process of the host), by its uid when the uid is given back (whatever left the cgroup or had none: a kill sent as
the uid, then one look), and by looking through every process as before where the cgroup cannot answer; a uid is
marked given back only once nothing of it is left. Real processes and cgroups."""

import asyncio
import os
import random
import select
import signal
import subprocess
import sys
from pathlib import Path
from shlex import quote

import psutil
import pytest

from shared.events import TaskStarted
from services.agent import cgroups as cgroups_module, isolation
from services.agent.cgroups import Cgroups, TaskCgroup, detect, plan, procs, remove
from services.agent.isolation import GIVEN_BACK, TaskUsers
from tests.factories import unique
from tests.unit.test_agent_isolation import HOG, ended, make_agent, run, start

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="tasks get users and cgroups of their own only under root")


def cgroups_here() -> Cgroups | None:
    return detect(pids_max=1024) if os.geteuid() == 0 else None


with_cgroups = pytest.mark.skipif(cgroups_here() is None, reason="no writable cgroup hierarchy on this host")


def unjoinable(self: Cgroups, *, name: str, memory_gb: float, cpu_count: float | None = None) -> TaskCgroup:
    """`Cgroups.create` of a hierarchy gone meanwhile: the task's cgroups are planned but never made."""
    return plan(
        self.layout, name=f"gone-{unique()}", memory_bytes=int(memory_gb * 2**30), pids_max=16, cpu_count=cpu_count
    )


@pytest.fixture
def scans(monkeypatch) -> list[int]:
    """Every look through all processes of the host, counted: for a uid (`isolation.host_processes`) or for a
    task's marker (`psutil.process_iter`, the environment of each)."""
    calls: list[int] = []
    real_iter, real_look = psutil.process_iter, isolation.host_processes

    def counted_iter(*args, **kwargs):
        calls.append(1)
        return real_iter(*args, **kwargs)

    def counted_look():
        calls.append(1)
        return real_look()

    monkeypatch.setattr(psutil, "process_iter", counted_iter)
    monkeypatch.setattr(isolation, "host_processes", counted_look)
    return calls


def test_a_cgroups_processes_are_listed_with_those_of_the_groups_nested_in_it(tmp_path):
    top = tmp_path / "uid-7"
    (top / "inner" / "deeper").mkdir(parents=True)
    (top / "cgroup.procs").write_text("11\n12\n")
    (top / "inner" / "cgroup.procs").write_text("13\n")
    (top / "inner" / "deeper" / "cgroup.procs").write_text("14\n")
    assert procs(top) == {11, 12, 13, 14}
    with pytest.raises(FileNotFoundError):  # no cgroup there: never an empty answer
        procs(tmp_path / "uid-8")


@root_only
@with_cgroups
async def test_a_task_held_by_its_cgroup_ends_with_one_look_through_every_process(tmp_path, scans):
    sent: list = []
    agent = make_agent(tmp_path, sent, confined=True, uids=1)
    first, _ = await run(agent, start(unique("first"), "true"), sent)
    assert first.reason == "completed", first
    scans.clear()
    second, _ = await run(agent, start(unique("second"), "sleep 0.2 & echo DONE"), sent)
    assert second.reason == "completed", second
    # the uid given back by the first task is claimed without a look; its end kills what its cgroup lists; the
    # uid's one sweep when it is given back (five of them and a read of every process's environment before)
    assert len(scans) == 1


@root_only
@with_cgroups
async def test_a_process_of_the_tasks_uid_outside_its_cgroup_is_found_by_its_uid(tmp_path, scans):
    sent: list = []
    agent = make_agent(tmp_path, sent, confined=True, uids=1)
    job_id = unique("escape")
    await agent.start(start(job_id, "while [ ! -e go ]; do sleep 0.05; done; echo DONE"))
    for _ in range(600):
        if any(isinstance(m, TaskStarted) and m.job_id == job_id for m in sent):
            break
        await asyncio.sleep(0.05)
    task = next(t for t in agent.tasks.values() if t.start.job_id == job_id)
    assert task.user is not None
    escaped = subprocess.Popen(["sleep", "300"], user=task.user.uid, group=task.user.gid, start_new_session=True)
    try:
        (task.workdir / "go").touch()
        exited, _ = await ended(job_id, sent)
        assert exited.reason == "completed", exited
        assert task.held_by_cgroup()  # the task itself was in its cgroup: the escaped one is found by its uid
        assert escaped.wait(timeout=10) == -signal.SIGKILL
    finally:
        escaped.kill()
        escaped.wait()


@root_only
@with_cgroups
async def test_a_task_whose_cgroup_was_not_joined_is_ended_by_looking_through_every_process(
    tmp_path, scans, monkeypatch
):
    monkeypatch.setattr(Cgroups, "create", unjoinable)
    sent: list = []
    agent = make_agent(tmp_path, sent, confined=True, uids=1)
    exited, output = await run(agent, start(unique("unjoined"), "echo DONE"), sent)
    assert exited.reason == "completed" and "cgroup could not be joined" in output, (exited, output)
    # its uid and its marker looked for at its end, its uid again after it and when given back (and at the claim)
    assert len(scans) >= 4


@root_only
@with_cgroups
async def test_a_task_whose_cgroup_was_not_joined_keeps_dev_shm_at_the_temporary_directories_bound(
    tmp_path, monkeypatch
):
    """/dev/shm is as large as the task's memory only where its cgroup counts it: unjoined, the agent's own measure
    would not see it, so it keeps the bound of the other temporary directories (64 MB here)."""

    monkeypatch.setattr(Cgroups, "create", unjoinable)
    sent: list = []
    agent = make_agent(tmp_path, sent, confined=True)
    fill = "dd if=/dev/zero of=/dev/shm/b bs=1M count=100 && echo SHM-HELD"
    exited, output = await run(agent, start(unique("shm"), fill, memory_gb=1), sent)
    assert "cgroup could not be joined" in output, output
    assert exited.reason == "failed" and "No space left on device" in output and "SHM-HELD" not in output, output


@root_only
@with_cgroups
def test_removing_a_tasks_cgroup_kills_and_removes_the_groups_nested_in_it():
    cgroups = cgroups_here()
    assert cgroups is not None
    cg = cgroups.create(name=f"nest-{unique()}", memory_gb=0.25)
    assert cg is not None
    inner = cg.dirs[0] / "inner"
    inner.mkdir()
    sleeper = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        (inner / "cgroup.procs").write_text(str(sleeper.pid))
        remove(cg)
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert not any(Path(d).exists() for d in cg.dirs)
    finally:
        sleeper.kill()
        sleeper.wait()


@root_only
def test_a_uid_not_given_back_is_claimed_only_while_no_process_has_it(tmp_path, scans):
    first = random.randrange(300_000, 900_000, 100)
    users = TaskUsers(first_uid=first, count=2, lock_dir=tmp_path / "uids")
    left = subprocess.Popen(["sleep", "300"], user=first, group=first, start_new_session=True)  # its agent died
    try:
        taken = users.claim()
        assert taken.uid == first + 1 and len(scans) == 1
        workdir = tmp_path / "work"
        workdir.mkdir()
        users.release(taken, workdir=workdir)
        scans.clear()
        again = TaskUsers(first_uid=first + 1, count=1, lock_dir=tmp_path / "uids")
        assert again.claim().uid == first + 1 and scans == []  # given back: taken without a look
    finally:
        left.kill()
        left.wait()


@root_only
@with_cgroups
async def test_a_task_whose_cgroup_was_not_joined_has_its_memory_measured_by_the_agent(tmp_path, monkeypatch):
    """The shim says so when it cannot join the cgroup; the agent used to wait for the cgroup's own kills, which
    could not come: the task ran without any memory limit."""

    monkeypatch.setattr(Cgroups, "create", unjoinable)
    sent: list = []
    agent = make_agent(tmp_path, sent, confined=True, uids=1)
    exited, output = await run(
        agent, start(unique("hog"), f"{sys.executable} -c {quote(HOG)} 96", memory_gb=0.5), sent
    )  # 1.5 GB in a detached process
    assert "cgroup could not be joined" in output, output
    assert exited.reason == "oom" and exited.oom == "host" and "HELD" not in output, (exited, output)


def test_a_nested_cgroup_gone_mid_walk_leaves_the_rest_killed_and_the_cgroup_not_given_up(tmp_path, monkeypatch):
    """A nested group removed between the walk and the read of its processes used to read as the whole cgroup
    gone: nothing of it killed, nothing removed, and nothing said."""
    monkeypatch.setattr(cgroups_module, "KILL_WAIT_S", 0.1)
    sleeper = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        top = tmp_path / "uid-9"
        (top / "gone").mkdir(parents=True)  # listed by the walk, its cgroup.procs gone by the read
        (top / "cgroup.procs").write_text(f"{sleeper.pid}\n")
        assert procs(top) == {sleeper.pid}
        cg = TaskCgroup(dirs=(top,), limits=(), oom_file=top / "memory.events")
        assert remove(cg) is False  # killed, but a directory (not a kernel cgroup) that cannot be removed: said so
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert remove(TaskCgroup(dirs=(tmp_path / "never",), limits=(), oom_file=tmp_path / "x")) is True
    finally:
        sleeper.kill()
        sleeper.wait()


HOPPER = "while (sysread(STDIN, my $b, 1)) { fork and exit; syswrite(STDOUT, 'x') }"  # each hop on a byte


def hop_during_every_look(monkeypatch, *, hopper: subprocess.Popen, trigger: int, hopped: int) -> None:
    """Each look through every process makes the hopper fork its successor and exit once the look listed the
    processes: the race a process that hops on its own wins now and then, won every time (the first hopper, the
    test's child, reaped: no dead process of the uid is left for the look to see)."""
    real = isolation.host_processes

    def looked():
        listing = real()
        first = next(listing, None)  # the processes are listed now
        try:
            os.write(trigger, b"h")
            os.read(hopped, 1)  # its successor forked (nothing when every hopper is dead)
            hopper.wait(timeout=10)
        except BrokenPipeError:  # no hopper left to read it
            pass
        if first is not None:
            yield first
        yield from listing

    monkeypatch.setattr(isolation, "host_processes", looked)


def kill_every_process_of(uid: int) -> None:
    """The test's own clean-up, whatever the code under test did."""
    for _ in range(3):
        subprocess.run(["/bin/sh", "-c", "kill -9 -1"], user=uid, group=uid, extra_groups=[], cwd="/", check=False)


@root_only
def test_a_uid_whose_process_forks_its_successor_and_exits_is_emptied_before_it_is_given_back(tmp_path, monkeypatch):
    """One look through every process (the release's only one before) misses a process forked, after the look
    listed the processes, by a parent that then exits: it lived on under a uid marked given back, which the next
    task (another tenant) got without a look. The kill is now sent as the uid first, which no fork slips past."""
    users = TaskUsers(first_uid=random.randrange(300_000, 900_000, 100), count=1, lock_dir=tmp_path / "uids")
    taken = users.claim()
    released_past_a_hopper(
        users, taken, HOPPER, tmp_path, monkeypatch, clean_up=lambda: kill_every_process_of(taken.uid)
    )


def released_past_a_hopper(users, taken, script: str, tmp_path, monkeypatch, *, clean_up) -> None:
    """Release `taken` while a perl `script` of its uid hops past every look; nothing of it may outlive the release,
    and the uid is marked given back."""
    trigger_r, trigger_w = os.pipe()
    hopped_r, hopped_w = os.pipe()  # every hopper holds its write end: its reader sees the end once all are dead
    hopper = subprocess.Popen(
        ["perl", "-e", script], user=taken.uid, group=taken.gid, extra_groups=[], stdin=trigger_r, stdout=hopped_w
    )
    os.close(trigger_r)
    os.close(hopped_w)
    try:
        hop_during_every_look(monkeypatch, hopper=hopper, trigger=trigger_w, hopped=hopped_r)
        workdir = tmp_path / "work"
        workdir.mkdir()
        users.release(taken, workdir=workdir)
        readable, _, _ = select.select([hopped_r], [], [], 10)
        assert readable and os.read(hopped_r, 64) == b"", "a process of the uid outlived its release"
        assert (users.lock_dir / str(taken.uid)).read_bytes() == GIVEN_BACK
    finally:
        clean_up()
        hopper.wait()
        os.close(trigger_w)
        os.close(hopped_r)


@root_only
def test_a_uid_whose_release_left_a_process_is_not_marked_and_its_next_claim_looks(tmp_path, scans, monkeypatch):
    """A process of the uid that a kill does not end (one stuck in the kernel): the uid is not marked given back."""
    monkeypatch.setattr(isolation, "EVICT_WAIT_S", 0.1, raising=False)
    monkeypatch.setattr(isolation, "kill_user", lambda uid: 1)  # found alive at every look
    first = random.randrange(300_000, 900_000, 100)
    users = TaskUsers(first_uid=first, count=1, lock_dir=tmp_path / "uids")
    taken = users.claim()
    workdir = tmp_path / "work"
    workdir.mkdir()
    users.release(taken, workdir=workdir)
    assert (users.lock_dir / str(first)).read_bytes() == b""
    scans.clear()
    assert TaskUsers(first_uid=first, count=1, lock_dir=tmp_path / "uids").claim().uid == first
    assert len(scans) == 1  # looked for (and found nothing this time: the stuck process was a pretence)


@root_only
def test_a_uid_whose_cgroup_could_not_be_emptied_is_not_marked_given_back(tmp_path, monkeypatch):
    """remove() used to log and the uid was marked given back anyway: a process left in the cgroup (stuck in the
    kernel, or past the kill's wait) would share its uid with the next task, taken without a look."""
    monkeypatch.setattr(cgroups_module, "KILL_WAIT_S", 0.1)
    agent = make_agent(tmp_path, [], confined=True, uids=1, cgroups=False)
    rules = agent.supervisor.confinement
    assert rules is not None
    taken = rules.users.claim()
    top = tmp_path / "cgroup" / f"uid-{taken.uid}"
    top.mkdir(parents=True)
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    (top / "cgroup.procs").write_text(f"{pid_max + 1}\n")  # listed, never gone: no process of the host has it
    cg = TaskCgroup(dirs=(top,), limits=(), oom_file=top / "memory.events")
    workdir = tmp_path / "work"
    workdir.mkdir()
    agent.supervisor._release(workdir, taken, cg)
    assert (rules.users.lock_dir / str(taken.uid)).read_bytes() == b""


@root_only
def test_a_uid_never_given_back_is_claimed_with_what_a_look_could_not_see_killed(tmp_path, monkeypatch):
    """A uid whose last agent died (or whose release could not be verified) is looked for; a process that hops
    past the look is killed by the claim, not left to share the uid with the next task."""
    users = TaskUsers(first_uid=random.randrange(300_000, 900_000, 100), count=1, lock_dir=tmp_path / "uids")
    uid = users.first_uid
    trigger_r, trigger_w = os.pipe()
    hopped_r, hopped_w = os.pipe()
    hopper = subprocess.Popen(
        ["perl", "-e", HOPPER], user=uid, group=uid, extra_groups=[], stdin=trigger_r, stdout=hopped_w
    )
    os.close(trigger_r)
    os.close(hopped_w)
    try:
        hop_during_every_look(monkeypatch, hopper=hopper, trigger=trigger_w, hopped=hopped_r)
        assert users.claim().uid == uid  # no process seen by the look
        readable, _, _ = select.select([hopped_r], [], [], 10)
        assert readable and os.read(hopped_r, 64) == b"", "the claimed uid is shared with a process of before"
    finally:
        kill_every_process_of(uid)
        hopper.wait()
        os.close(trigger_w)
        os.close(hopped_r)


SETUID = """
import os, sys, time
other, uid = int(sys.argv[1]), int(sys.argv[2])
os.setresgid(other, other, other)
os.setresuid(other, uid, other)  # the uid as its effective one only (as a set-user-ID file of the uid gives)
os.write(1, b"x")
time.sleep(300)
"""


@root_only
def test_a_uid_held_as_a_processs_effective_uid_only_is_in_use(tmp_path):
    """The claim's look matched real uids only, the kill real and effective ones: a process running with the uid as
    its effective uid (reading the uid's files, signalling its processes) did not make it busy."""
    first = random.randrange(300_000, 900_000, 100)
    users = TaskUsers(first_uid=first, count=2, lock_dir=tmp_path / "uids")
    holder = subprocess.Popen([sys.executable, "-c", SETUID, str(first + 50), str(first)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.read(1) == b"x"
        assert users.claim().uid == first + 1
    finally:
        holder.kill()
        holder.wait()


@root_only
def test_a_kill_the_uid_itself_killed_first_still_leaves_the_look_to_kill_and_the_uid_unmarked(tmp_path, monkeypatch):
    """A process of the uid can kill the kill sent as the uid (it runs as that uid) before it is sent: the look
    through every process then still kills what it sees, and the uid is not marked given back."""
    monkeypatch.setattr(isolation, "EVICT_WAIT_S", 0.5, raising=False)
    users = TaskUsers(first_uid=random.randrange(300_000, 900_000, 100), count=1, lock_dir=tmp_path / "uids")
    taken = users.claim()
    monkeypatch.setattr(isolation, "kill_as", lambda uid: False)  # killed first, every time
    survivor = subprocess.Popen(["sleep", "60"], user=taken.uid, group=taken.gid, extra_groups=[])
    try:
        workdir = tmp_path / "work"
        workdir.mkdir()
        users.release(taken, workdir=workdir)
        assert survivor.wait(timeout=10) == -signal.SIGKILL
        assert (users.lock_dir / str(taken.uid)).read_bytes() == b""
    finally:
        kill_every_process_of(taken.uid)
        survivor.wait()


KILLING_HOPPER = """
vec(my $in = '', 0, 1) = 1;
while (1) {
    kill 9, -1;  # every other process of its uid, a kill sent as the uid included
    next unless select(my $ready = $in, undef, undef, 0);
    sysread(STDIN, my $b, 1) or exit;
    fork and exit;
    syswrite(STDOUT, 'x');
}
"""  # it hops on a byte, as HOPPER, and between hops kills every process of its uid but itself


def kill_every_process_of_from_outside(uid: int, *, other: int) -> None:
    """The test's own clean-up, which no process of `uid` can kill (real uid `other`, unused), whatever the code
    under test did."""
    code = f"import os; os.setgroups([]); os.setresgid({other}, {other}, {other}); os.setresuid({other}, {uid}, {other}); os.kill(-1, 9)"  # noqa: E501
    for _ in range(3):
        subprocess.run([sys.executable, "-c", code], check=False)


@root_only
def test_a_uid_whose_process_kills_its_uid_while_it_hops_is_emptied_before_it_is_given_back(tmp_path, monkeypatch):
    """Where no cgroup and no PID namespace holds a task, a process that kept killing every process of its uid
    (so the kill sent as the uid died before it was sent) while forking its successor past every look outlived its
    task: the uid was never marked given back but the process ran on, unbilled. The kill now comes from a process
    whose real and saved uid is the uid's shadow, which no process of the uid may signal."""
    monkeypatch.setattr(isolation, "EVICT_WAIT_S", 0.5, raising=False)  # what the code before spent hunting it
    first = random.randrange(300_000, 900_000, 100)
    users = TaskUsers(first_uid=first, count=1, lock_dir=tmp_path / "uids")
    taken = users.claim()
    released_past_a_hopper(
        users,
        taken,
        KILLING_HOPPER,
        tmp_path,
        monkeypatch,
        clean_up=lambda: kill_every_process_of_from_outside(taken.uid, other=first + 1),
    )


IN_NARROW_USERNS = """
import ctypes, os, sys
from services.agent import isolation
assert ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0  # CLONE_NEWUSER, mapped by the test
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.readline()
print(isolation.run_killer(int(sys.argv[1]), shadow=isolation.shadow_uid(int(sys.argv[1]))), isolation.kill_as(int(sys.argv[1])))
"""  # noqa: E501


@root_only
def test_where_the_shadow_uid_cannot_be_taken_the_kill_is_sent_as_the_uid_itself(tmp_path):
    """A user namespace that maps no uid from 2**31 (the shadows): the killer says so, and the processes of the uid
    are still killed, by a kill sent as the uid itself."""
    uid = random.randrange(300_000, 900_000, 100)
    sleeper = subprocess.Popen(["sleep", "300"], user=uid, group=uid, extra_groups=[])
    inside = subprocess.Popen(
        [sys.executable, "-c", IN_NARROW_USERNS, str(uid)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert inside.stdin is not None and inside.stdout is not None
        assert inside.stdout.readline() == "ready\n"
        for ids in ("uid_map", "gid_map"):
            Path(f"/proc/{inside.pid}/{ids}").write_text(f"0 0 {2**31}\n")
        inside.stdin.write("go\n")
        inside.stdin.flush()
        assert inside.stdout.readline().split() == [str(isolation.SHADOW_UNAVAILABLE), "True"]
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
    finally:
        sleeper.kill()
        sleeper.wait()
        inside.kill()
        inside.wait()


def test_task_uids_end_below_their_shadows_and_no_account_is_a_shadow(tmp_path, monkeypatch):
    """A range reaching 2**31 would give a task the uid of another task's killer; a killer whose real uid is an
    account's would kill that account's processes with the task's."""
    from services.agent import app as agent_app

    with pytest.raises(ValueError, match="at or below"):
        TaskUsers(first_uid=2**31 - 10, count=10, lock_dir=Path("/nonexistent"))
    settings = agent_app.AgentSettings(node_id="n1", data_dir=tmp_path, task_uid_first=2**31 - 10, task_uid_count=10)
    with pytest.raises(SystemExit, match="goes past uid"):
        agent_app.task_uid_first(settings)
    shadowed = settings.model_copy(update={"task_uid_first": 300_000})
    monkeypatch.setattr(agent_app, "account_uids", lambda: {1000, isolation.shadow_uid(300_005)})
    with pytest.raises(SystemExit, match="include uids of this host's accounts"):  # a host account's processes
        agent_app.task_uid_first(shadowed)
    monkeypatch.setattr(agent_app, "account_uids", lambda: {1000})
    assert agent_app.task_uid_first(shadowed) == 300_000
    rootless = [(isolation.shadow_uid(300_000) - 100, isolation.shadow_uid(300_000) + 65_436)]  # a subuid above 2**31
    monkeypatch.setattr(agent_app, "subordinate_spans", lambda: rootless)
    with pytest.raises(SystemExit, match="subordinate id ranges"):  # a rootless container's processes
        agent_app.task_uid_first(shadowed)
    assert isolation.shadow_uid(2**31 - 2) == 2**32 - 2  # the last one is still a uid ((uid_t)-1 is none)


@root_only
def test_one_killer_started_once_kills_for_every_uid_and_a_dead_one_is_started_again():
    """A kill is a fork of the agent's killer, not a Python start each (~15 ms of CPU for every task a node runs)."""
    killers = isolation.Killers()
    uids = [random.randrange(300_000, 900_000, 100) + i for i in range(2)]
    sleepers = [subprocess.Popen(["sleep", "300"], user=uid, group=uid, extra_groups=[]) for uid in uids]
    try:
        assert killers.run(uids[0], shadow=isolation.shadow_uid(uids[0])) == 0
        assert sleepers[0].wait(timeout=10) == -signal.SIGKILL and sleepers[1].poll() is None  # its uid's only
        first = killers._process
        assert first is not None
        first.kill()  # died between kills: started again
        first.wait()
        assert killers.run(uids[1], shadow=isolation.shadow_uid(uids[1])) == 0
        assert sleepers[1].wait(timeout=10) == -signal.SIGKILL
        assert killers._process is not None and killers._process.poll() is None
        assert killers._process.pid != first.pid
        assert killers.run(uids[1], shadow=isolation.shadow_uid(uids[1])) == 0  # the same killer, again
    finally:
        killers.stop()
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
