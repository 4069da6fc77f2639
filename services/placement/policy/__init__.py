"""Placement policy: pure functions shared by the placement service, the simulator and the benchmarks."""

from services.placement.policy.config import PolicyConfig
from services.placement.policy.decisions import Decision, MakeRoom, Provision, PullBack, Release, Start, Wait
from services.placement.policy.models import ClusterState, InstanceType, JobRequest, Node, RunningJob
from services.placement.policy.registry import POLICIES, schedule

__all__ = [
    "POLICIES",
    "ClusterState",
    "Decision",
    "InstanceType",
    "JobRequest",
    "MakeRoom",
    "Node",
    "PolicyConfig",
    "Provision",
    "PullBack",
    "Release",
    "RunningJob",
    "Start",
    "Wait",
    "schedule",
]
