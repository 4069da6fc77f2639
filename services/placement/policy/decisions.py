"""Outputs of the placement policy: what the caller should do now."""

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Start:
    """Run `job_id` now; rank i on `node_ids[i]` using GPUs `gpu_indices[i]`."""

    job_id: str
    node_ids: tuple[str, ...]
    gpu_indices: tuple[tuple[int, ...], ...]
    why: str = field(default="", compare=False)  # the options weighed and the rule that chose (policy/why.py)


@dataclass(frozen=True, slots=True)
class Provision:
    """Create `count` on-demand nodes of `instance_type` for `job_id` (it starts once they are ready)."""

    instance_type: str
    count: int
    job_id: str


@dataclass(frozen=True, slots=True)
class Release:
    """Give an idle on-demand node back to the cloud."""

    node_id: str


@dataclass(frozen=True, slots=True)
class PullBack:
    """Checkpoint `job_id` on on-demand `from_node_id` and resume it on owned `to_node_id`."""

    job_id: str
    from_node_id: str
    to_node_id: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MakeRoom:
    """Rent `count` nodes of `instance_type` for running `job_id`, checkpoint it on the owned `node_ids` and resume it
    on the rented nodes (kept for it), so that jobs that may only run on owned capacity get those GPUs."""

    job_id: str
    node_ids: tuple[str, ...]
    instance_type: str
    count: int = 1


@dataclass(frozen=True, slots=True)
class Wait:
    """Leave `job_id` queued; `until` is the estimated start when known; `retry_at`: run a pass then; `node_ids`:
    the nodes it waits for, when it holds a reservation on them (what a dry run prices)."""

    job_id: str
    reason: str
    until: float | None = None
    retry_at: float | None = None
    node_ids: tuple[str, ...] = field(default=(), compare=False)


Decision = Start | Provision | Release | PullBack | MakeRoom | Wait
