"""`trainmaster-sim`: replay a trace on a hybrid cluster under one placement policy."""

import argparse
import json
import sys
import time

from services.placement.policy import POLICIES, PolicyConfig
from services.placement.sim.catalogue import DEFAULT_CATALOGUE, REFERENCE_TFLOPS
from services.placement.sim.durations import SOURCES
from services.placement.sim.engine import Simulation
from services.placement.sim.metrics import summarise
from services.placement.sim.spot import spot_offers
from services.placement.sim.trace import TraceOptions, load_jobs, load_nodes

DEFAULT_LOCAL = 16  # 16 two-GPU P100 workstations
DEFAULT_RESERVED = 8  # 6 P100 nodes, one 8-GPU G3, one 8-GPU V100M32: 60 owned GPUs, the trace peaks at 71

TRACE_DEFAULTS = TraceOptions()
POLICY_DEFAULTS = PolicyConfig()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainmaster-sim", description=__doc__)
    p.add_argument("--pods", required=True, help="openb_pod_list_*.csv")
    p.add_argument("--nodes", required=True, help="openb_node_list_gpu_node.csv")
    p.add_argument("--policy", default="trainmaster", choices=sorted(POLICIES))
    p.add_argument("--local", type=int, default=DEFAULT_LOCAL, help="first N nodes of the list are local")
    p.add_argument("--reserved", type=int, default=DEFAULT_RESERVED, help="next M nodes are reserved cloud")
    p.add_argument("--idle-release-s", type=float, default=POLICY_DEFAULTS.idle_release_s)
    p.add_argument(
        "--finish-tolerance-frac",
        type=float,
        default=POLICY_DEFAULTS.finish_tolerance_frac,
        help="time-sensitive: finishes this close (fraction of time to finish) count as equal",
    )
    p.add_argument(
        "--exchange-rate",
        type=float,
        default=POLICY_DEFAULTS.exchange_rate,
        help="on-demand dollars worth paying to finish one GPU-hour sooner (0: never rent to save time)",
    )
    p.add_argument(
        "--cost-sensitive-weight",
        type=float,
        default=POLICY_DEFAULTS.cost_sensitive_weight,
        help="the share of the exchange rate a cost-sensitive job's time is worth",
    )
    p.add_argument(
        "--cost-sensitive-backlog-weight",
        type=float,
        default=POLICY_DEFAULTS.cost_sensitive_backlog_weight,
        help="the share of the rate a cost-sensitive owned-only job's wait is charged at (default 1.0: all of it)",
    )
    p.add_argument(
        "--one-owned-queue",
        choices=("on", "off"),
        default="on" if POLICY_DEFAULTS.one_owned_queue else "off",
        help="an owned-only job waits in one queue over every owned GPU it may use (off: one per kind and model)",
    )
    p.add_argument(
        "--owned-choice-charge",
        choices=("on", "off"),
        default="on" if POLICY_DEFAULTS.owned_choice_charge else "off",
        help="a cost-sensitive job weighs the wait it causes others when it keeps its cheapest owned options",
    )
    p.add_argument(
        "--owned-wait-order",
        choices=("on", "off"),
        default="on" if POLICY_DEFAULTS.owned_wait_order else "off",
        help="local-only jobs queue first, by GPU-seconds per dollar of wait (off: time-sensitive first)",
    )
    p.add_argument(
        "--burst-after-s",
        type=float,
        default=POLICY_DEFAULTS.burst_after_s,
        help="burst-after: a job rents only after waiting this long",
    )
    p.add_argument("--local-only-frac", type=float, default=TRACE_DEFAULTS.local_only_frac)
    p.add_argument("--cloud-only-frac", type=float, default=TRACE_DEFAULTS.cloud_only_frac)
    p.add_argument("--estimate-error", type=float, default=0.0, help="log-normal sigma on expected durations")
    p.add_argument(
        "--duration-source",
        default="trace",
        choices=sorted(SOURCES),
        help="trace: oracle (or --estimate-error); history: per-user median of finished jobs, like the "
        "estimator, the owner's (erroneous) expectation until then",
    )
    p.add_argument(
        "--spot",
        action="store_true",
        help="also offer every instance type on spot (sim/spot.py), to jobs that checkpoint",
    )
    p.add_argument("--spot-seed", type=int, default=0, help="seed of the spot interruptions")
    p.add_argument(
        "--spot-hazard-scale",
        type=float,
        default=1.0,
        help="multiply every family's interruption hazard (the policy is told the same)",
    )
    p.add_argument("--limit", type=int, default=0, help="replay only the first N jobs (0 = all)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def simulate(args: argparse.Namespace) -> dict:
    options = TraceOptions(
        local_only_frac=args.local_only_frac, cloud_only_frac=args.cloud_only_frac, estimate_error=args.estimate_error
    )
    jobs, skipped = load_jobs(args.pods, options)
    if args.limit:
        jobs = jobs[: args.limit]
    nodes = load_nodes(args.nodes, local=args.local, reserved=args.reserved)
    config = policy_config(args)
    started = time.perf_counter()
    spot = spot_offers(DEFAULT_CATALOGUE, hazard_scale=args.spot_hazard_scale) if args.spot else ()
    catalogue = DEFAULT_CATALOGUE + spot
    out = Simulation(
        jobs,
        nodes,
        catalogue=catalogue,
        config=config,
        durations=SOURCES[args.duration_source](),
        spot_seed=args.spot_seed,
    ).run()
    result = {
        "policy": args.policy,
        "local_nodes": args.local,
        "reserved_nodes": args.reserved,
        "estimate_error": args.estimate_error,
        "duration_source": args.duration_source,
        "spot": args.spot,
        "spot_seed": args.spot_seed,
        "spot_hazard_scale": args.spot_hazard_scale,
    }
    result |= summarise(jobs, out)
    result["skipped_no_gpu"] = skipped.no_gpu
    result["skipped_never_scheduled"] = skipped.never_scheduled
    result["skipped_zero_run_time"] = skipped.zero_run_time
    result["fractional_gpu_rounded_up"] = skipped.fractional_gpu_rounded_up
    result["wall_s"] = round(time.perf_counter() - started, 2)
    return result


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    result = simulate(args)
    if args.json:
        json.dump(result, sys.stdout)
        sys.stdout.write("\n")
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")
    return 0


def policy_config(args: argparse.Namespace, *, policy: str | None = None) -> PolicyConfig:
    """The policy settings the command line names (`policy` instead of `--policy` when given)."""
    return PolicyConfig(
        policy=args.policy if policy is None else policy,
        reference_tflops=REFERENCE_TFLOPS,
        idle_release_s=args.idle_release_s,
        finish_tolerance_frac=args.finish_tolerance_frac,
        exchange_rate=args.exchange_rate,
        cost_sensitive_weight=args.cost_sensitive_weight,
        cost_sensitive_backlog_weight=args.cost_sensitive_backlog_weight,
        one_owned_queue=args.one_owned_queue == "on",
        owned_choice_charge=args.owned_choice_charge == "on",
        owned_wait_order=args.owned_wait_order == "on",
        burst_after_s=args.burst_after_s,
    )
