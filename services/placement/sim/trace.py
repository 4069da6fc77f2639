"""Turn the Alibaba GPU trace (pods and nodes CSV) into simulator jobs and a hybrid cluster."""

import csv
import hashlib
import math
from dataclasses import dataclass
from typing import Literal

from services.placement.policy import JobRequest, Node
from services.placement.sim.catalogue import GPU_MODELS, RESERVED_PRICE_FACTOR, UNKNOWN_MODEL


@dataclass(frozen=True, slots=True)
class TraceOptions:
    local_only_frac: float = 0.10
    cloud_only_frac: float = 0.10
    ts_deadline_factor: float = 2.0
    ts_deadline_slack_s: float = 1800.0
    cost_deadline_factor: float = 4.0
    cost_deadline_slack_s: float = 4 * 3600.0
    estimate_error: float = 0.0  # sigma of a log-normal error on the owner's expectation; 0 = exact
    # The trace has no checkpoints: a job its owner expects to run longer than an hour checkpoints every 30 min
    # (a short job restarts from scratch instead, so it declares none and never runs on spot).
    checkpoint_after_s: float = 3600.0
    checkpoint_interval_s: float = 1800.0


@dataclass(slots=True)
class TraceJob:
    request: JobRequest
    run_time_s: float  # actual run time at the reference throughput
    qos: str


@dataclass(slots=True)
class Skipped:
    no_gpu: int = 0
    never_scheduled: int = 0
    zero_run_time: int = 0
    fractional_gpu_rounded_up: int = 0


def stable_fraction(name: str, salt: str) -> float:
    digest = hashlib.blake2b(f"{salt}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def load_jobs(path: str, options: TraceOptions = TraceOptions()) -> tuple[list[TraceJob], Skipped]:
    """GPU pods that ran; CPU-only pods and pods never scheduled are skipped and counted."""
    jobs: list[TraceJob] = []
    skipped = Skipped()
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            gpus = int(row["num_gpu"] or 0)
            if gpus <= 0:
                skipped.no_gpu += 1
                continue
            if not row["scheduled_time"] or not row["deletion_time"]:
                skipped.never_scheduled += 1
                continue
            run_time = float(row["deletion_time"]) - float(row["scheduled_time"])
            if run_time <= 0:
                skipped.zero_run_time += 1
                continue
            if int(row["gpu_milli"] or 1000) < 1000:
                skipped.fractional_gpu_rounded_up += 1
            jobs.append(_job(row, gpus, run_time, options))
    jobs.sort(key=lambda j: (j.request.submitted_at, j.request.id))
    return jobs, skipped


def _job(row: dict[str, str], gpus: int, run_time: float, options: TraceOptions) -> TraceJob:
    name, qos = row["name"], row["qos"]
    priority: Literal["time", "cost"] = "time" if qos in ("LS", "Guaranteed") else "cost"
    draw = stable_fraction(name, "allowed")
    allowed: Literal["local", "cloud", "any"] = (
        "local"
        if draw < options.local_only_frac
        else ("cloud" if draw < options.local_only_frac + options.cloud_only_frac else "any")
    )
    factor, slack = (
        (options.ts_deadline_factor, options.ts_deadline_slack_s)
        if priority == "time"
        else (options.cost_deadline_factor, options.cost_deadline_slack_s)
    )
    submitted = float(row["creation_time"])
    expected = run_time
    if options.estimate_error > 0:
        z = math.sqrt(-2 * math.log(max(stable_fraction(name, "u1"), 1e-12))) * math.cos(
            2 * math.pi * stable_fraction(name, "u2")
        )
        expected = run_time * math.exp(options.estimate_error * z)
    models = frozenset(m for m in row["gpu_spec"].split("|") if m)
    request = JobRequest(
        id=name,
        user=f"shape-{row['cpu_milli']}-{row['memory_mib']}-{gpus}",
        submitted_at=submitted,
        expected_duration_s=expected,
        allowed=allowed,
        priority=priority,
        gpu_count=gpus,
        gpu_models=models,
        deadline=submitted + factor * run_time + slack,
        cpu=int(row["cpu_milli"]) / 1000,
        memory_gb=int(row["memory_mib"]) / 1024,
        duration_sigma=options.estimate_error,
        checkpoint_interval_s=options.checkpoint_interval_s if expected > options.checkpoint_after_s else None,
    )
    return TraceJob(request, run_time, qos)


def load_nodes(path: str, *, local: int, reserved: int) -> list[Node]:
    """The first `local` nodes are owned workstations, the next `reserved` are reserved cloud nodes: each as the
    policy's own record of a node (`policy.Node`), idle."""
    specs = []
    with open(path, newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            if i >= local + reserved:
                break
            kind: Literal["local", "reserved"] = "local" if i < local else "reserved"
            model = GPU_MODELS.get(row["model"], UNKNOWN_MODEL)
            gpus = int(row["gpu"])
            factor = 1.0 if kind == "local" else RESERVED_PRICE_FACTOR
            cpu, memory_gb = int(row["cpu_milli"]) / 1000, int(row["memory_mib"]) / 1024
            specs.append(
                Node(
                    row["sn"],
                    kind,
                    row["model"],
                    gpus,
                    model.memory_gb,
                    model.tflops,
                    cpu,
                    memory_gb,
                    round(gpus * model.owned_price_per_gpu_hour * factor, 4),
                    free_gpu_indices=tuple(range(gpus)),
                    free_cpu=cpu,
                    free_memory_gb=memory_gb,
                )
            )
    return specs
