"""The cluster file (`cluster.toml`), parsed in one place into one typed model; each process reads its part:
the agent its node's entry and the engines, placement the catalogue, providers, flavors and trade-off, every
service the static nodes' records, the submitter and agents the storage allow-list.

Tolerant on read (a section or key this version does not know is kept, not refused); a file that is missing,
not TOML, or whose known parts have the wrong shape raises `ClusterFileError`, and each reader decides what that
means for it (the agent stops; a service without node records refuses every registration)."""

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from shared.nodes import NodeKind


class ClusterFileError(ValueError):
    """The cluster file or an entry in it is unusable."""


class GpuGroup(BaseModel):
    """`count` GPUs of one model in a `[[nodes]]` entry."""

    model_config = ConfigDict(frozen=True, extra="allow")

    model: str
    memory_gb: float
    tflops: float = 0.0
    count: int = Field(1, ge=0)


class NodeEntry(BaseModel):
    """A `[[nodes]]` entry: what the node's agent describes (without NVML) and the record its claims are capped to."""

    model_config = ConfigDict(frozen=True, extra="allow")

    id: str = ""
    kind: NodeKind = "local"
    price_per_hour: float = Field(0.0, ge=0)
    gpus: tuple[GpuGroup, ...] = ()
    max_gpus: int = Field(0, ge=0, description="GPUs at most when none are listed (the agent reads them via NVML).")
    cpu_count: float | None = None
    memory_gb: float | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    pool: str | None = None
    address: str | None = Field(
        None,
        description="Where other ranks of a distributed job reach this node; none: the address it reaches the bus "
        "from (a rented node's, learnt at its start).",
    )
    agent: bool = Field(True, description="False: a record only (the stack starts no agent for it).")

    @field_validator("labels", mode="before")
    @classmethod
    def _as_text(cls, labels: Any) -> Any:
        return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else labels

    def all_labels(self) -> dict[str, str]:
        """Its labels with its pool (`pool`, else the `pool` label, else "default")."""
        return {**self.labels, "pool": self.pool if self.pool is not None else self.labels.get("pool", "default")}


def node_entry(entry: "NodeEntry | Mapping[str, Any]") -> NodeEntry:
    """A `[[nodes]]` entry as the model (one given as a table is checked)."""
    return entry if isinstance(entry, NodeEntry) else NodeEntry.model_validate(entry)


class ClusterFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    nodes: tuple[NodeEntry, ...] = ()
    engines: tuple[dict[str, Any], ...] = Field((), description="[[engines]]: training environments, by name.")
    instance_types: tuple[dict[str, Any], ...] = Field((), description="[[instance_types]]: what may be rented.")
    catalogue: dict[str, Any] | None = Field(None, description="[catalogue]: rows of a catalogue data file.")
    providers: dict[str, dict[str, Any]] = Field(default_factory=dict, description="[providers.*]: their settings.")
    flavors: tuple[dict[str, Any], ...] = ()
    storage: dict[str, Any] = Field(default_factory=dict, description="[storage]: allowed_urls, allow_hosts.")
    placement: dict[str, Any] = Field(default_factory=dict, description="[placement]: the cost/time trade-off.")

    def nodes_by_id(self) -> dict[str, NodeEntry]:
        """The entries with an id, by id (a later entry of the same id wins)."""
        return {entry.id: entry for entry in self.nodes if entry.id}

    def engines_by_name(self) -> dict[str, dict[str, Any]]:
        return {e["name"]: e for e in self.engines if e.get("name")}


def parse_cluster(text: str, *, source: str = "cluster file") -> ClusterFile:
    try:
        return ClusterFile.model_validate(tomllib.loads(text))
    except (tomllib.TOMLDecodeError, ValidationError) as exc:
        raise ClusterFileError(f"{source}: {exc}") from exc


def read_cluster(path: Path, *, missing_ok: bool = False) -> ClusterFile:
    """The cluster file at `path`; an empty one when it is missing and `missing_ok`."""
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        if missing_ok:
            return ClusterFile()
        raise ClusterFileError(f"{path}: {exc}") from exc
    except OSError as exc:
        raise ClusterFileError(f"{path}: {exc}") from exc
    return parse_cluster(text, source=str(path))
