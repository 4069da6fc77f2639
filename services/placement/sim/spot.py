"""The simulated spot market: offers at a fraction of on-demand, and when the cloud takes a spot node back.

Prices: the rentable catalogue file (`services/placement/data/catalogue.csv`) lists a spot price beside each
on-demand one; a family's spot fraction is the median spot/on-demand ratio of its rows there, and a family the file
does not list takes the file's median. Interruptions: a constant hazard per hour per instance family, from the
AWS Spot Instance Advisor's monthly "frequency of interruption" bucket (bench/sched/README.md says which bucket each
family gets and why). A node's time to interruption is exponential, drawn from a hash of the seed and the node id,
so a run is reproducible and one node's draw does not depend on the order of events.
"""

import math
import statistics
from dataclasses import replace
from pathlib import Path

from services.placement.catalogue import DATA_DIR, SPOT_SUFFIX, read_gpus, read_offers
from services.placement.policy import InstanceType
from services.placement.sim.trace import stable_fraction

HOURS_PER_MONTH = 730.0
# A bucket's upper edge, as the chance that a node kept a whole month is taken back (">20%": assumed 30%).
BUCKET_MONTHLY = {"<5%": 0.05, "5-10%": 0.10, "10-15%": 0.15, "15-20%": 0.20, ">20%": 0.30}
# Which bucket each family of the simulator's catalogue is in (reasons in bench/sched/README.md).
FAMILY_BUCKET = {"g4dn": "5-10%", "g5": "15-20%", "p3": ">20%", "p3dn": ">20%"}
UNLISTED_BUCKET = ">20%"  # a family we know nothing about is assumed as unreliable as the worst bucket


def family(instance_type: str) -> str:
    """`g5.12xlarge` -> `g5`; a spot entry's suffix does not change its family."""
    return instance_type.removesuffix(SPOT_SUFFIX).split(".", 1)[0]


def hazard_per_hour(bucket: str) -> float:
    """Interruptions per node-hour of a bucket: P(taken back within a month) = 1 - exp(-hazard x 730 h)."""
    return -math.log(1.0 - BUCKET_MONTHLY[bucket]) / HOURS_PER_MONTH


def family_hazard(instance_type: str) -> float:
    return hazard_per_hour(FAMILY_BUCKET.get(family(instance_type), UNLISTED_BUCKET))


def spot_fractions(data_dir: Path = DATA_DIR) -> tuple[dict[str, float], float]:
    """(spot/on-demand ratio per family, the median over every row) from the catalogue file."""
    gpus = read_gpus((data_dir / "gpus.csv").read_text())
    ratios: dict[str, list[float]] = {}
    for o in read_offers((data_dir / "catalogue.csv").read_text(), gpus):
        if o.spot_price and o.price:
            ratios.setdefault(family(o.instance_type), []).append(o.spot_price / o.price)
    overall = statistics.median(r for rs in ratios.values() for r in rs)
    return {f: statistics.median(rs) for f, rs in ratios.items()}, overall


def spot_offers(
    catalogue: tuple[InstanceType, ...], *, hazard_scale: float = 1.0, data_dir: Path = DATA_DIR
) -> tuple[InstanceType, ...]:
    """One spot entry (`<type>.spot`) per on-demand type, at its family's fraction and with its family's hazard
    (times `hazard_scale`, to test how much the result owes to the buckets)."""
    by_family, overall = spot_fractions(data_dir)
    return tuple(
        replace(
            it,
            name=it.name + SPOT_SUFFIX,
            spot=True,
            interruptions_per_hour=family_hazard(it.name) * hazard_scale,
            price_per_hour=round(it.price_per_hour * by_family.get(family(it.name), overall), 4),
        )
        for it in catalogue
        if not it.spot
    )


def interruption_after_s(node_id: str, *, hazard_per_hour: float, seed: int) -> float:
    """Seconds from a spot node's request until the cloud takes it back (inf: never)."""
    if hazard_per_hour <= 0:
        return math.inf
    u = stable_fraction(node_id, f"spot-{seed}")
    return -math.log1p(-u) / hazard_per_hour * 3600


def kept_compute_s(elapsed_s: float, *, checkpoint_interval_s: float) -> float:
    """Of `elapsed_s` computed since the last restore, what the last checkpoint holds (the rest is lost)."""
    if elapsed_s <= 0:
        return 0.0
    return math.floor(elapsed_s / checkpoint_interval_s) * checkpoint_interval_s
