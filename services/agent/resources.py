"""What a node offers: read from NVML when the machine has NVIDIA GPUs, else from the cluster file."""
import logging
import os
import socket
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shared.nodes import Gpu, NodeInfo
from services.agent.throughput import with_measured

log = logging.getLogger(__name__)

# Dense BF16 tensor TFLOPS by model, for GPUs found through NVML (the driver does not report it).
KNOWN_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "L4": 121.0,
                "V100": 125.0, "T4": 65.0, "RTX 4090": 165.0, "RTX 3090": 71.0, "A6000": 155.0}


class ClusterFileError(ValueError):
    """The cluster file or the node's entry in it is unusable."""


def load_cluster(path: Path) -> dict[str, dict[str, Any]]:
    """The [[nodes]] of a cluster file, by id."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ClusterFileError(f"{path}: {exc}") from exc
    nodes = {entry.get("id", ""): entry for entry in data.get("nodes", [])}
    if "" in nodes:
        raise ClusterFileError(f"{path}: every [[nodes]] entry needs an id")
    return nodes


def agent_node_ids(path: Path) -> list[str]:
    """The nodes of a cluster file that run an agent: all but entries with `agent = false` (a record only: what a
    node the stack does not start, such as a simulated one, may register as)."""
    return [node_id for node_id, entry in load_cluster(path).items() if entry.get("agent", True)]


def load_engines(path: Path) -> dict[str, dict[str, Any]]:
    """The [[engines]] of a cluster file (name, packages, image), by name."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    return {e["name"]: e for e in data.get("engines", []) if e.get("name")}


def node_from_config(entry: dict[str, Any], *, virtual: bool) -> NodeInfo:
    gpus: list[Gpu] = []
    for group in entry.get("gpus", []):
        for _ in range(int(group.get("count", 1))):
            gpus.append(Gpu(index=len(gpus), model=group["model"], memory_gb=group["memory_gb"],
                            tflops=group.get("tflops", 0)))
    return NodeInfo(
        node_id=entry["id"],
        kind=entry.get("kind", "local"),
        hostname=socket.gethostname(),
        address=entry.get("address", "127.0.0.1"),
        gpus=tuple(gpus),
        cpu_count=entry.get("cpu_count", os.cpu_count() or 1),
        memory_gb=entry.get("memory_gb", 4),
        price_per_hour=entry.get("price_per_hour", 0.0),
        labels={**entry.get("labels", {}), "pool": entry.get("pool", entry.get("labels", {}).get("pool", "default"))},
        resources_source="config",
        virtual=virtual,
    )


def gpus_from_nvml() -> tuple[Gpu, ...] | None:
    """The machine's NVIDIA GPUs, or None without a driver or the nvidia-ml-py package."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
            tflops = next((t for key, t in KNOWN_TFLOPS.items() if key in name), 0.0)
            gpus.append(Gpu(index=index, model=name, memory_gb=round(memory, 1), tflops=tflops))
        return tuple(gpus)
    finally:
        pynvml.nvmlShutdown()


def describe_node(entry: dict[str, Any], *, use_nvml: bool, virtual: bool,
                  measure: Callable[[], dict[int, float]] | None = None) -> NodeInfo:
    """The node record to register: real GPUs when NVML finds them (each with its throughput when `measure` is
    given and measures it), the configured ones otherwise."""
    node = node_from_config(entry, virtual=virtual)
    found = gpus_from_nvml() if use_nvml else None
    if found:
        log.info("NVML found %d GPU(s); the cluster file's GPU list is not used", len(found))
        if measure is not None:
            found = with_measured(found, measure())
            log.info("GPU throughput: %s", ", ".join(f"{g.index}: {g.measured_tflops} TFLOPS measured, "
                                                      f"{g.tflops} in the table" for g in found))
        return node.model_copy(update={"gpus": found, "resources_source": "nvml", "virtual": False})
    return node
