"""The pure parts of a task's confinement: where its cgroups go and what they limit, its passwd entry, which System
V objects are its uid's, and each stack's own uid range."""

import grp
import json
from pathlib import Path

import pytest

from services.agent.app import AgentSettings, task_uid_first, task_uid_locks
from services.agent.cgroups import Layout, cgroup_mounts, choose_layout, detect, oom_kills, own_cgroups, plan
from services.agent.leftovers import ipc_ids
from services.agent.quota import disk_usage, over_quota
from services.agent.shim import account_files
from services.agent.uidrange import account_uids, choose_first, claim_range, subordinate_spans

V1_MOUNTS = """tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
V1_OWN = "8:pids:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n"


def test_v1_task_cgroups_go_under_the_agents_own_in_the_memory_pids_and_cpu_hierarchies():
    layout = choose_layout(mounts=cgroup_mounts(V1_MOUNTS), own=own_cgroups(V1_OWN), v2_controllers=set())
    assert layout == Layout(
        version=1,
        memory=Path("/sys/fs/cgroup/memory/process_api/abc/trainmaster-tasks"),
        pids=Path("/sys/fs/cgroup/pids/trainmaster-tasks"),
        cpu=Path("/sys/fs/cgroup/cpu/trainmaster-tasks"),
    )
    cg = plan(layout, name="uid-7", memory_bytes=2**30, pids_max=100, cpu_count=1.5)
    memory, cpu = layout.memory / "uid-7", Path("/sys/fs/cgroup/cpu/trainmaster-tasks/uid-7")
    assert cg.dirs == (memory, Path("/sys/fs/cgroup/pids/trainmaster-tasks/uid-7"), cpu)
    assert cg.limits == (
        (memory / "memory.limit_in_bytes", str(2**30)),
        (memory / "memory.memsw.limit_in_bytes", str(2**30)),
        (Path("/sys/fs/cgroup/pids/trainmaster-tasks/uid-7/pids.max"), "100"),
        (cpu / "cpu.cfs_period_us", "100000"),
        (cpu / "cpu.cfs_quota_us", "150000"),  # 1.5 CPUs' worth a 100 ms period
    )
    assert cg.oom_file == memory / "memory.oom_control"
    assert cg.procs_files == [str(d / "cgroup.procs") for d in cg.dirs]
    # no CPU count: no cpu cgroup; a combined "cpu,cpuacct" mount is the cpu hierarchy; without it, none
    assert plan(layout, name="uid-7", memory_bytes=2**30, pids_max=100).dirs == cg.dirs[:2]
    combined = V1_MOUNTS.replace("/cpu cgroup rw,relatime,cpu ", "/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct ")
    assert cgroup_mounts(combined)["cpu"] == Path("/sys/fs/cgroup/cpu,cpuacct")
    bare = choose_layout(mounts=cgroup_mounts(V1_MOUNTS.replace("cpu", "cpuset")), own={}, v2_controllers=set())
    assert bare is not None and bare.cpu is None and not bare.limits_cpu
    assert len(plan(bare, name="uid-7", memory_bytes=1, pids_max=1, cpu_count=2).dirs) == 2


def test_a_v1_hierarchy_carrying_several_controllers_is_one_directory_of_the_task():
    mounts = cgroup_mounts("cgroup /sys/fs/cgroup/cpu,memory,pids cgroup rw,cpu,memory,pids 0 0\n")
    layout = choose_layout(mounts=mounts, own=own_cgroups("3:cpu,memory,pids:/agent\n"), v2_controllers=set())
    assert layout is not None and layout.memory == layout.cpu == layout.pids
    cg = plan(layout, name="uid-7", memory_bytes=1, pids_max=2, cpu_count=1)
    assert cg.dirs == (layout.memory / "uid-7",)  # made once (a second mkdir would fail the task's cgroup)
    assert {path.name for path, _ in cg.limits} >= {"memory.limit_in_bytes", "pids.max", "cpu.cfs_quota_us"}


def test_a_tiny_cpu_count_gets_the_least_quota_the_kernel_takes():
    layout = Layout(version=1, memory=Path("/m"), pids=None, cpu=Path("/c"))
    assert (
        dict(plan(layout, name="t", memory_bytes=1, pids_max=1, cpu_count=0.001).limits)[Path("/c/t/cpu.cfs_quota_us")]
        == "1000"
    )


def test_v2_with_a_memory_controller_wins_and_the_agent_moves_into_a_leaf():
    mounts = cgroup_mounts("cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n")
    layout = choose_layout(
        mounts=mounts, own=own_cgroups("0::/system.slice/agent.service\n"), v2_controllers={"cpu", "memory", "pids"}
    )
    base = Path("/sys/fs/cgroup/system.slice/agent.service")
    assert layout == Layout(
        version=2,
        memory=base / "trainmaster-tasks",
        pids=None,
        agent_leaf=base / "agent",
        enable="+memory +pids +cpu",
    )
    cg = plan(layout, name="uid-7", memory_bytes=512, pids_max=64, cpu_count=2)
    task = base / "trainmaster-tasks" / "uid-7"
    assert cg.dirs == (task,) and cg.oom_file == task / "memory.events"
    assert dict(cg.limits) == {
        task / "memory.max": "512",
        task / "memory.swap.max": "0",
        task / "memory.oom.group": "1",
        task / "pids.max": "64",
        task / "cpu.max": "200000 100000",  # 2 CPUs' worth a 100 ms period
    }
    # the cpu controller refused: the same, less its CPU cap
    assert layout.without_cpu().enable == "+memory +pids" and not layout.without_cpu().limits_cpu
    assert task / "cpu.max" not in dict(plan(layout.without_cpu(), name="uid-7", memory_bytes=1, pids_max=1).limits)


def test_v2_at_the_root_needs_no_leaf_and_no_memory_controller_means_no_cgroups():
    mounts = cgroup_mounts("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n")
    assert choose_layout(mounts=mounts, own={"": "/"}, v2_controllers={"memory"}).agent_leaf is None
    assert choose_layout(mounts=mounts, own={"": "/"}, v2_controllers={"cpu", "pids"}) is None


def test_v2_enables_below_the_agent_only_the_controllers_it_was_given():
    mounts = cgroup_mounts("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n")
    layout = choose_layout(mounts=mounts, own=own_cgroups("0::/svc\n"), v2_controllers={"memory", "cpu"})
    assert layout is not None and layout.enable == "+memory +cpu"
    alone = choose_layout(mounts=mounts, own=own_cgroups("0::/svc\n"), v2_controllers={"memory"})
    assert alone is not None and alone.enable == "+memory" and not alone.limits_cpu


def test_a_memory_controller_the_root_has_but_the_agents_cgroup_was_not_given_means_no_cgroups(tmp_path, caplog):
    """Seen on the first real-GPU machine (cgroup v2, memory at the root, the agent under /process_api/<id> whose
    parent hands down no memory controller): enabling it below the agent failed with "No such file or directory".
    The agent's own cgroup.controllers decides, and the log says what to delegate."""
    root = tmp_path / "cg"
    own = root / "process_api" / "52fc"
    own.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids\n")
    (own / "cgroup.controllers").write_text("cpu pids\n")
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mounts").write_text(f"cgroup2 {root} cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n")
    (proc / "cgroup").write_text("0::/process_api/52fc\n")
    assert detect(pids_max=64, proc=proc) is None
    assert "not delegated to the agent's cgroup" in caplog.text and str(own) in caplog.text
    assert not (own / "agent").exists()  # nothing made on the way


def test_oom_kills_are_read_from_v1_and_v2_files():
    assert oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n") == 3
    assert oom_kills("low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n") == 1
    assert oom_kills("oom_kill_disable 0\nunder_oom 0\n") == 0


def test_the_task_gets_a_passwd_and_group_entry_of_its_own_and_no_host_entry_shadows_it():
    passwd = "root:x:0:0:root:/root:/bin/bash\ntm-200001:x:5:5::/:/bin/sh\nold:x:200001:1::/:/bin/sh\n"
    group = "root:x:0:\nold:x:200001:\n"
    users, groups = account_files(passwd=passwd, group=group, name="tm-200001", uid=200001, gid=200001, home="/data/w")
    assert users == "root:x:0:0:root:/root:/bin/bash\ntm-200001:x:200001:200001:trainmaster task:/data/w:/bin/sh\n"
    assert groups == "root:x:0:\ntm-200001:x:200001:\n"


PROC_SHM = """       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime
         0         10   600                  4096   100   100      0  200001 200001  200001 200001 0
  12345678         11   600                  4096   101   101      1     0     0     0     0 0
         0         12   666                  4096   102   102      0     0     0  200001 200001 0
"""
PROC_SEM = """       key      semid perms      nsems   uid   gid  cuid  cgid      otime      ctime
  1193046          3   600          1  200001 200001  200001 200001 0 0
"""


def test_the_uids_system_v_objects_are_found_by_owner_or_creator():
    assert ipc_ids(PROC_SHM, id_column="shmid", uid=200001) == [10, 12]
    assert ipc_ids(PROC_SHM, id_column="shmid", uid=5) == []
    assert ipc_ids(PROC_SEM, id_column="semid", uid=200001) == [3]
    assert ipc_ids("", id_column="msqid", uid=1) == []


def test_each_stack_gets_a_range_no_other_overlaps_and_keeps_it():
    taken = {"/a": [200_000, 100], "/c": [200_250, 100]}
    assert choose_first(taken, key="/b", count=100) == 200_100
    assert choose_first(taken, key="/b", count=200) == 200_350
    assert choose_first(taken, key="/a", count=100) == 200_000  # its own again
    assert choose_first({}, key="/a", count=65_536) == 200_000
    with pytest.raises(ValueError):
        choose_first({}, key="/a", count=2**31)


def test_a_range_never_holds_a_uid_of_the_hosts_accounts():
    """A task must never run as a person's or a daemon's uid (a directory service's accounts often sit high)."""
    assert choose_first({}, key="/a", count=100, accounts={0, 1000, 200_050}) == 200_051
    taken = {"/a": [200_000, 100]}
    assert choose_first(taken, key="/a", count=100, accounts={200_099}) == 200_100  # an account made since: moved
    assert choose_first(taken, key="/b", count=100, accounts={200_150}) == 200_151


def test_a_configured_range_holding_an_account_refuses_to_start(tmp_path, monkeypatch):
    from services.agent import app as agent_app

    monkeypatch.setattr(agent_app, "account_uids", lambda: {1000, 65534})
    monkeypatch.setattr(agent_app, "subordinate_spans", lambda: [])
    settings = agent_app.AgentSettings(node_id="n1", data_dir=tmp_path, task_uid_first=1000, task_uid_count=65_536)
    with pytest.raises(SystemExit, match="1000, 65534"):
        agent_app.task_uid_first(settings)
    assert agent_app.task_uid_first(settings.model_copy(update={"task_uid_first": 300_000})) == 300_000


def test_disk_usage_counts_files_below_and_follows_no_link(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x" * 100_000)
    (tmp_path / "link").symlink_to("/usr")
    assert 100_000 <= disk_usage(str(tmp_path)) < 200_000
    assert over_quota(2**30 + 1, 1) and not over_quota(2**30, 1)


def test_the_registry_keeps_each_stacks_range_and_forgets_stacks_whose_data_is_gone(tmp_path):
    registry = tmp_path / "run" / "ranges.json"
    one, two, gone = (tmp_path / name for name in ("one", "two", "gone"))
    for d in (one, two, gone):
        d.mkdir()
    firsts = [claim_range(registry, data_dir=d, count=1000) for d in (one, two, gone)]
    assert firsts == [200_000, 201_000, 202_000]
    assert claim_range(registry, data_dir=one, count=1000) == 200_000  # an agent of the same stack, later
    gone.rmdir()
    assert claim_range(registry, data_dir=tmp_path / "three", count=1000) == 202_000
    assert json.loads(registry.read_text())[str(two)] == [201_000, 1000]


def test_a_stack_claims_its_own_range_under_its_data_dir_and_a_configured_range_host_wide(tmp_path):
    own = AgentSettings(
        node_id="n", data_dir=tmp_path / "data", task_uid_registry=tmp_path / "ranges.json", task_uid_count=10
    )
    assert task_uid_first(own) == 200_000 and task_uid_locks(own) == tmp_path / "data" / "task-uids"
    other = own.model_copy(update={"data_dir": tmp_path / "other"})
    (tmp_path / "data").mkdir()
    assert task_uid_first(other) == 200_010
    shared = own.model_copy(update={"task_uid_first": 500_000})
    assert task_uid_first(shared) == 500_000 and task_uid_locks(shared) == Path("/run/trainmaster/task-uids")


def test_a_range_holds_no_subordinate_ids_of_rootless_containers_and_no_groups_gid(tmp_path, monkeypatch):
    """A user's `/etc/subuid` range is where their rootless containers run: a task given one of those ids could
    signal those processes or read their files (and a group's gid gives its files)."""
    subuid = tmp_path / "subuid"
    subuid.write_text("alice:100000:65536\nbob:165536:65536\ncarol:231072:65536\n# comment\nbroken:x:1\n")
    spans = subordinate_spans([subuid, tmp_path / "absent"])
    assert spans == [(100_000, 165_536), (165_536, 231_072), (231_072, 296_608)]
    assert choose_first({}, key="/a", count=65_536, spans=spans) == 296_608
    assert choose_first({"/a": [200_000, 65_536]}, key="/a", count=65_536, spans=spans) == 296_608  # moved
    from services.agent import app as agent_app

    monkeypatch.setattr(agent_app, "account_uids", lambda: set())
    monkeypatch.setattr(agent_app, "subordinate_spans", lambda: spans)
    settings = agent_app.AgentSettings(node_id="n1", data_dir=tmp_path, task_uid_first=250_000, task_uid_count=100)
    with pytest.raises(SystemExit, match="231072"):
        agent_app.task_uid_first(settings)
    assert {entry.gr_gid for entry in grp.getgrall()} <= account_uids()


def test_folders_any_user_may_write_are_found_to_their_depth_and_not_looked_into(tmp_path):
    """Ubuntu's /var/crash, a site's /scratch: a file one task left there, the next task (another project's) found;
    only /tmp, /var/tmp, /dev/shm and /run/lock were covered (noted by review, built 2026-11-29)."""
    from services.agent.isolation import writable_by_anyone

    def folder(path: str, mode: int) -> Path:
        made = tmp_path / path
        made.mkdir(parents=True, exist_ok=True)
        made.chmod(mode)
        return made

    folder("var", 0o755)
    crash = folder("var/crash", 0o1777)
    folder("var/crash/inner", 0o777)  # inside one found: covered with it, not listed
    folder("srv/a/b", 0o755)
    deep = folder("srv/a/b/c", 0o777)  # four levels down: past the depth looked at
    shared = folder("data/exchange", 0o777)
    (tmp_path / "link").symlink_to(crash)  # a link is not followed
    mine = folder("home/ana", 0o700)
    found = writable_by_anyone(str(tmp_path), skip=(str(shared),), depth=3)
    assert found == [str(crash)]
    assert str(deep) not in found and str(mine) not in found
    assert writable_by_anyone(str(tmp_path), depth=4) == [str(shared), str(crash), str(deep)]  # level by level
    (tmp_path / "shared").symlink_to(shared)  # shared by a link's name: its folder is not covered (found by review)
    assert str(shared) not in writable_by_anyone(str(tmp_path), skip=(str(tmp_path / "shared"),))


def test_a_long_look_covers_the_shallow_folders_first_and_says_what_it_did_not_look_at(tmp_path, caplog):
    """Depth first in name order, a /home of many folders used the whole budget before /scratch or /var was seen
    (found by review): the look goes level by level, and what was left is logged."""
    from services.agent.isolation import writable_by_anyone

    for i in range(3000):
        (tmp_path / "home" / f"u{i:04}").mkdir(parents=True)
    (tmp_path / "scratch").mkdir()
    (tmp_path / "scratch").chmod(0o1777)
    with caplog.at_level("WARNING"):
        assert writable_by_anyone(str(tmp_path), budget_s=0.0) == []  # nothing looked at: said so
        assert "were not looked into or not covered" in caplog.text
        assert writable_by_anyone(str(tmp_path), budget_s=2.0, depth=1) == [str(tmp_path / "scratch")]


def test_remote_and_automounted_filesystems_are_never_walked_into():
    mountinfo = (
        "22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/root rw\n"
        "40 22 0:45 / /home rw,relatime shared:20 - autofs systemd-1 rw,fd=29\n"
        "41 22 0:50 / /mnt/data rw,relatime - nfs4 server:/export rw,vers=4.2\n"
        "42 22 0:51 / /mnt/my\\040drive rw - fuse.sshfs me@host: rw\n"
        "43 22 0:52 / /run rw,nosuid - tmpfs tmpfs rw\n"
    )
    from services.agent.isolation import remote_mounts

    assert remote_mounts(mountinfo) == ["/home", "/mnt/data", "/mnt/my drive"]


def test_a_task_sees_folders_any_user_may_write_as_private_ones_and_shared_ones_as_they_are(tmp_path, monkeypatch):
    from services.agent import isolation

    seen = {}

    def found(*, skip):
        seen["skip"] = skip
        return ["/var/crash", "/tmp", "/srv/scratch"]

    monkeypatch.setattr(isolation, "writable_by_anyone", found)
    rules = isolation.confinement(
        users=isolation.TaskUsers(first_uid=900_000, count=2, lock_dir=tmp_path / "locks"),
        sdk_dir=tmp_path / "sdk",
        data_dir=tmp_path / "data",
        storage_dirs=[],
        shared_dirs=[Path("/srv/shared")],
    )
    assert rules.cover["/var/crash"] == rules.cover["/srv/scratch"] == rules.cover["/tmp"] == 0o1777
    assert "/srv/shared" in seen["skip"] and str((tmp_path / "data").resolve()) in seen["skip"]


def test_a_remote_mount_is_not_walked_into_and_no_more_than_max_covered_are_covered(tmp_path, monkeypatch, caplog):
    from services.agent import isolation

    (tmp_path / "nfs" / "open").mkdir(parents=True)
    (tmp_path / "nfs" / "open").chmod(0o777)
    monkeypatch.setattr(isolation, "remote_mounts", lambda text: [str(tmp_path / "nfs")])
    assert isolation.writable_by_anyone(str(tmp_path)) == []  # a stale NFS mount would have hung the look
    monkeypatch.setattr(isolation, "MAX_COVERED", 3)
    for i in range(5):
        (tmp_path / "many" / f"f{i}").mkdir(parents=True)
        (tmp_path / "many" / f"f{i}").chmod(0o777)
    with caplog.at_level("WARNING"):
        found = isolation.writable_by_anyone(str(tmp_path))
    assert found == [str(tmp_path / "many" / f"f{i}") for i in range(3)] and "past 3 covered" in caplog.text


@pytest.mark.parametrize("refused", ["the host refuses them to the agent", None])
def test_local_storage_is_closed_to_tasks_where_no_mount_namespace_covers_it(tmp_path, monkeypatch, caplog, refused):
    """A root agent whose tasks get no mount namespace (a Pod without CAP_SYS_ADMIN) ran them with the host's
    view, every project's checkpoints readable through 0755 folders (found by review): its local storage folders
    are closed (0700) there, and one it does not own is named; with namespaces they are covered and left as they
    are (a folder the operator shares stays shared)."""
    import os
    import stat

    from shared.storage import StoragePolicy
    from services.agent import app as agent_app

    monkeypatch.setattr(agent_app, "is_root", lambda: True)
    monkeypatch.setattr(agent_app, "mount_namespaces_refused", lambda: refused)
    monkeypatch.setattr(agent_app, "detect", lambda **_: None)
    monkeypatch.setattr(agent_app, "confinement", lambda **kw: kw)
    storage, checkpoints, theirs = tmp_path / "storage", tmp_path / "checkpoints", tmp_path / "theirs"
    storage.mkdir(mode=0o755)
    theirs.mkdir(mode=0o755)
    storage.chmod(0o755)
    theirs.chmod(0o755)
    os_stat = os.stat
    monkeypatch.setattr(
        os, "stat", lambda p, **kw: _owned_by(os_stat(p, **kw), 12345) if str(p) == str(theirs) else os_stat(p, **kw)
    )
    settings = AgentSettings(node_id="n1", data_dir=tmp_path, task_uid_first=250_000, task_uid_count=10)
    for roots in ((storage, checkpoints), (theirs, checkpoints)):
        policy = StoragePolicy(storage_root=f"file://{roots[0]}", checkpoint_root=f"file://{roots[1]}")
        agent_app.task_confinement(settings, policy)
    modes = {p.name: stat.S_IMODE(os_stat(p).st_mode) for p in (storage, checkpoints, theirs) if p.exists()}
    if refused:
        assert modes == {"storage": 0o700, "checkpoints": 0o700, "theirs": 0o755}
        assert f"but for {theirs}" in caplog.text
    else:
        assert modes == {"storage": 0o755, "theirs": 0o755} and "closed to them" not in caplog.text


def _owned_by(st, uid: int):
    """`st` as if another user owned the file."""
    import os

    values = list(st)
    values[4] = uid
    return os.stat_result(values)


def test_a_storage_folder_that_is_the_root_or_holds_what_tasks_reach_is_not_closed(tmp_path):
    from services.agent.isolation import close_to_others

    data, storage, outer = tmp_path / "srv" / "tm", tmp_path / "store", tmp_path / "srv"
    for folder in (data, storage):
        folder.mkdir(parents=True, mode=0o755)
        folder.chmod(0o755)
    outer.chmod(0o755)
    left = close_to_others([Path("/"), outer, storage], reached=[data])
    assert left == [Path("/"), outer]  # `/` and a folder holding the data directory: named, left as they are
    assert (outer.stat().st_mode & 0o777, storage.stat().st_mode & 0o777) == (0o755, 0o700)


def test_the_file_system_of_a_path_is_that_of_its_longest_mount_point():
    from services.agent.quota import filesystem_of

    mountinfo = (
        "22 1 253:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "30 22 0:40 / /data rw - xfs /dev/vdb rw\n"
        "31 30 0:41 / /data/fast\\040disk rw - tmpfs tmpfs rw\n"
    )
    assert filesystem_of("/data/x", mountinfo) == "xfs"
    assert filesystem_of("/data/fast disk/y", mountinfo) == "tmpfs"
    assert filesystem_of("/datasets", mountinfo) == "ext4"  # /data is not its prefix: a whole name is
