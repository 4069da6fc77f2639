"""What pick() weighs: one way to run a job (start now, wait for nodes, or provision one) with its finish and cost."""

from dataclasses import dataclass, field

from services.placement.policy.capacity import NodeView
from services.placement.policy.models import InstanceType


@dataclass(slots=True)
class Option:
    action: str  # "start" | "wait" | "provision"
    start_at: float
    finish: float
    cost: float
    paid: bool
    kind_rank: int
    duration: float
    picks: list[tuple[NodeView, tuple[int, ...]]] = field(default_factory=list)  # "start": the GPUs it takes
    views: list[NodeView] = field(default_factory=list)  # "wait": the nodes it waits for
    instance: InstanceType | None = None
    why: str = ""  # set on the option pick() chose: why it was chosen (policy/why.py)
    charge: float = 0.0  # dollars of waiting it puts on jobs that may only run there (policy/contention.py)
    # "provision": dollars of the idle grace after the job before the node rented for it is released
    # (`PolicyConfig.idle_release_s`): the simulator and billing charge it (to no job), so the policy weighs it too
    grace: float = 0.0
