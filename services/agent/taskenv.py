"""What the agent adds to a task's environment besides the job's own: where it marks progress, the collective
defaults (read by the runner that starts the task and by the hang watch that reads the mark)."""

PROGRESS_FILE = "progress"  # in the attempt's directory; its path is the task's TRAINMASTER_PROGRESS_FILE
# What PyTorch's ProcessGroupNCCL reads (the collective timeout itself is init_process_group's `timeout`, 10 minutes
# for NCCL by default; no variable sets it): a collective that times out or fails aborts the communicators and ends
# the process instead of leaving it stuck, and a process whose NCCL watchdog is itself stuck is ended too. Set
# unless the job sets the variable (or its older name) itself.
COLLECTIVE_DEFAULTS = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_ENABLE_MONITORING": "1"}
OLDER_NAMES = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "NCCL_ASYNC_ERROR_HANDLING"}


def collective_defaults(own: dict[str, str]) -> dict[str, str]:
    """The collective-communication settings a task gets, less those its job sets itself (`own`)."""
    return {
        name: value
        for name, value in COLLECTIVE_DEFAULTS.items()
        if name not in own and OLDER_NAMES.get(name) not in own
    }


def thread_defaults(own: dict[str, str], *, cpus: int, pinned: bool) -> dict[str, str]:
    """OpenMP's thread count (PyTorch's intra-op threads, and MKL's through it) for a task that may use `cpus` CPUs
    but was not pinned to them (agents sharing a host, `services/agent/cpus.py`): it would size its threads by every
    CPU of the host and be throttled by its cgroup's CPU cap. Pinned, OpenMP counts the CPUs it may run on itself.
    Nothing where its job sets the variable (`own`)."""
    if pinned or "OMP_NUM_THREADS" in own:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, cpus))}
