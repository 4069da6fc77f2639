"""Tunables of the placement policy; defaults carry their reason."""
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    policy: str = "trainmaster"
    # Durations are given at this throughput; a job runs duration * reference / node TFLOPS.
    reference_tflops: float = 12.0
    # Finishes closer than this count as equal, so the cheaper (owned) option wins the tie.
    finish_tolerance_s: float = 300.0
    finish_tolerance_frac: float = 0.10
    # Off: a time-sensitive job may pay for a faster on-demand GPU even when a slower owned one is free (earliest
    # finish, as designed). On: it pays only to avoid waiting. Trade-off per cluster size in bench/sched/README.md.
    pay_only_to_avoid_waiting: bool = False
    # On-demand nodes idle this long are released; a short grace lets the next job reuse a booted node.
    idle_release_s: float = 600.0
    # Pull-back (design: "more than 1 hour for example"): remaining time and checkpoint/restore cost.
    pullback_min_remaining_s: float = 3600.0
    migration_s: float = 300.0
    migration_fixed_cost: float = 0.0
    # A time-sensitive job is moved only if it then ends at most this fraction of its remaining time later.
    pullback_max_slowdown: float = 0.10
    max_pullbacks_per_pass: int = 8
    # The design pulls back only when nothing waits; owned GPUs still free after the queue pass are wanted by no
    # waiting job either (each job was offered them), so by default those may be used as well.
    pullback_only_when_queue_empty: bool = False
    # Bounded work per pass (like Slurm's bf_max_job_test): jobs examined and reservations held.
    max_jobs_per_pass: int = 512
    reservation_depth: int = 64
    max_nodes_scanned: int = 64
    # Fair share charges at most this much of a started job to its user within one pass.
    fair_share_charge_cap_s: float = 3600.0
