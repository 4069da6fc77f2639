"""Flavors and pools: what a job may name instead of raw resources, and which groups of nodes exist (pure); and
the rentable catalogue read from its data file."""

import csv
import io
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.cluster import ClusterFile
from shared.nodes import NodeInfo
from shared.rpc import Catalogue, Flavor, Pool
from services.placement.policy import InstanceType


def flavors(
    nodes: Iterable[NodeInfo], catalogue: Iterable[InstanceType], declared: Iterable[Mapping[str, Any]]
) -> list[Flavor]:
    """The cluster file's [[flavors]]; without any, one per shape of node the fleet has or may rent."""
    declared = list(declared)
    if declared:
        return [Flavor(**{k: v for k, v in f.items() if k in Flavor.model_fields}) for f in declared]
    shapes: dict[tuple, Flavor] = {}
    for node in nodes:
        gpu = node.gpus[0] if node.gpus else None
        key = (gpu.model if gpu else "cpu", len(node.gpus))
        flavor = shapes.get(key)
        if flavor is None:
            shapes[key] = Flavor(
                flavor_id=_name(key),
                gpu_model=key[0] if gpu else "",
                gpu_count=len(node.gpus),
                gpu_memory_gb=min((g.memory_gb for g in node.gpus), default=0),
                tflops=gpu.tflops if gpu else 0,
                cpu_count=node.cpu_count,
                memory_gb=node.memory_gb,
                price_per_hour=node.price_per_hour,
                max_node_count=1,
            )
        else:
            shapes[key] = flavor.model_copy(
                update={
                    "max_node_count": flavor.max_node_count + 1,
                    "price_per_hour": min(flavor.price_per_hour or 0, node.price_per_hour),
                }
            )
    for it in catalogue:
        key = (it.gpu_model, it.gpus)
        if key not in shapes:
            shapes[key] = Flavor(
                flavor_id=_name(key),
                gpu_model=it.gpu_model,
                gpu_count=it.gpus,
                gpu_memory_gb=it.gpu_memory_gb,
                tflops=it.tflops,
                cpu_count=it.cpu,
                memory_gb=it.memory_gb,
                price_per_hour=it.price_per_hour,
                max_node_count=64,
            )
    return sorted(shapes.values(), key=lambda f: f.flavor_id)


def pools(nodes: Iterable[NodeInfo]) -> list[Pool]:
    groups: dict[str, list[NodeInfo]] = {}
    for node in nodes:
        groups.setdefault(node.labels.get("pool", "default"), []).append(node)
    return [
        Pool(
            pool_id=name,
            node_ids=sorted(n.node_id for n in members),
            kinds=sorted({n.kind for n in members}),
            gpus=sum(len(n.gpus) for n in members),
        )
        for name, members in sorted(groups.items())
    ]


def catalogue(
    nodes: list[NodeInfo], instance_types: Iterable[InstanceType], declared: Iterable[Mapping[str, Any]]
) -> Catalogue:
    return Catalogue(flavors=flavors(nodes, instance_types, declared), pools=pools(nodes))


def _name(key: tuple) -> str:
    model, count = key
    return f"{model.lower().replace(' ', '-')}.{count}x" if count else "cpu"


# --- The rentable catalogue as a data file (SkyPilot-like columns), which an operator updates --------------------
DATA_DIR = Path(__file__).parent / "data"
OFFER_COLUMNS = (
    "instance_type",
    "accelerator",
    "accelerator_count",
    "vcpus",
    "memory_gib",
    "price",
    "spot_price",
    "region",
    "zone",
    "startup_s",
)
OFFER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,47}$")  # becomes part of node ids and TOML strings
SPOT_SUFFIX = ".spot"


@dataclass(frozen=True)
class Offer:
    """One row of the catalogue file: an instance type in one zone, at its on-demand and spot prices."""

    instance_type: str
    accelerator: str
    count: int
    gpu_memory_gb: float
    tflops: float
    cpu: float
    memory_gb: float
    price: float
    spot_price: float | None
    region: str
    zone: str
    startup_s: float


def read_gpus(text: str) -> dict[str, tuple[float, float]]:
    """The per-GPU table: accelerator -> (TFLOPS, memory GiB)."""
    table = {}
    for line, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
        name = _name_field(row, "accelerator", line)
        table[name] = (_number(row, "tflops", line), _number(row, "memory_gib", line))
    return table


def read_offers(text: str, gpus: Mapping[str, tuple[float, float]]) -> list[Offer]:
    """The catalogue file's rows; a bad row raises naming its line and column."""
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in OFFER_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"catalogue: missing columns {', '.join(missing)}")
    offers = []
    for line, row in enumerate(reader, start=2):
        accelerator = (row.get("accelerator") or "").strip()
        if accelerator and accelerator not in gpus:
            raise ValueError(f"catalogue line {line}: accelerator {accelerator!r} is not in the GPU table")
        tflops, memory = gpus.get(accelerator, (0.0, 0.0))
        spot = (row.get("spot_price") or "").strip()
        offers.append(
            Offer(
                instance_type=_name_field(row, "instance_type", line),
                accelerator=accelerator,
                count=int(_number(row, "accelerator_count", line)) if accelerator else 0,
                gpu_memory_gb=memory,
                tflops=tflops,
                cpu=_number(row, "vcpus", line),
                memory_gb=_number(row, "memory_gib", line),
                price=_number(row, "price", line),
                spot_price=_number(row, "spot_price", line) if spot else None,
                region=_name_field(row, "region", line),
                zone=_name_field(row, "zone", line),
                startup_s=_number(row, "startup_s", line),
            )
        )
    return offers


def offered(
    offers: Iterable[Offer],
    *,
    provider: str,
    region: str | None = None,
    instance_types: Iterable[str] | None = None,
    spot: bool = False,
) -> list[dict]:
    """[[instance_types]] entries from catalogue rows: one per type (its cheapest zone first), and with `spot` a
    second one named `<type>.spot` at the spot price."""
    wanted = set(instance_types) if instance_types is not None else None
    rows: dict[str, list[Offer]] = {}
    for offer in offers:
        if (region is None or offer.region == region) and (wanted is None or offer.instance_type in wanted):
            rows.setdefault(offer.instance_type, []).append(offer)
    entries = []
    for name, group in sorted(rows.items()):
        if not group[0].count:
            continue  # placement rents GPU nodes only
        markets = [("on_demand", min(o.price for o in group))]
        spots = [o.spot_price for o in group if o.spot_price is not None]
        if spot and spots:
            markets.append(("spot", min(spots)))
        for market, price in markets:
            by_price = sorted(group, key=lambda o: o.price if market == "on_demand" else (o.spot_price or o.price))
            o = group[0]
            entries.append(
                {
                    "name": name + (SPOT_SUFFIX if market == "spot" else ""),
                    "gpus": o.count,
                    "gpu_model": o.accelerator,
                    "gpu_memory_gb": o.gpu_memory_gb,
                    "tflops": o.tflops,
                    "cpu": o.cpu,
                    "memory_gb": o.memory_gb,
                    "price_per_hour": price,
                    "startup_delay_s": max(x.startup_s for x in group),
                    "provider": provider,
                    "market": market,
                    "cloud_type": name,
                    "region": o.region,
                    "zones": [x.zone for x in by_price],
                }
            )
    return entries


def catalogue_entries(cluster: ClusterFile, *, base: Path, default_provider: str = "local-process") -> list[dict]:
    """Every rentable entry of a cluster file: its [[instance_types]] and the rows its [catalogue] selects."""
    entries = [dict(e) for e in cluster.instance_types]
    for entry in entries:
        if not OFFER_NAME.match(str(entry.get("name", ""))):
            raise ValueError(f"instance_types: name {entry.get('name')!r} must match {OFFER_NAME.pattern}")
        entry.setdefault("provider", default_provider)
        entry.setdefault("market", "spot" if str(entry["name"]).endswith(SPOT_SUFFIX) else "on_demand")
        entry.setdefault("cloud_type", str(entry["name"]).removesuffix(SPOT_SUFFIX))
    section = cluster.catalogue
    if section:
        path = lambda key, default: (base / section[key]) if key in section else default  # noqa: E731
        gpus = read_gpus(path("gpus_file", DATA_DIR / "gpus.csv").read_text())
        offers = read_offers(path("file", DATA_DIR / "catalogue.csv").read_text(), gpus)
        entries += offered(
            offers,
            provider=section.get("provider", default_provider),
            region=section.get("region"),
            instance_types=section.get("instance_types"),
            spot=bool(section.get("spot", False)),
        )
    return entries


def _name_field(row: Mapping[str, str | None], column: str, line: int) -> str:
    value = (row.get(column) or "").strip()
    if not OFFER_NAME.match(value):
        raise ValueError(f"catalogue line {line}: {column} {value!r} must match {OFFER_NAME.pattern}")
    return value


def _number(row: Mapping[str, str | None], column: str, line: int) -> float:
    try:
        value = float((row.get(column) or "").strip())
    except ValueError:
        raise ValueError(f"catalogue line {line}: {column} must be a number, not {row.get(column)!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"catalogue line {line}: {column} must be a finite number >= 0, not {value}")
    return value
