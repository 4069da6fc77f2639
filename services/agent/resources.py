"""What a node offers: read from NVML when the machine has NVIDIA GPUs, else from its cluster-file entry
(`shared.cluster`)."""

import logging
import os
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from shared.bus import servers
from shared.cluster import ClusterFile, ClusterFileError, NodeEntry, node_entry, read_cluster
from shared.nodes import Gpu, NodeInfo, datasheet_tflops
from services.agent.throughput import with_measured

log = logging.getLogger(__name__)


def load_cluster(path: Path) -> dict[str, NodeEntry]:
    """The [[nodes]] of a cluster file, by id (`ClusterFileError` when it is unusable or an entry has no id)."""
    return node_entries(read_cluster(path), source=path)


def node_entries(cluster: ClusterFile, *, source: Path) -> dict[str, NodeEntry]:
    """The [[nodes]] of a cluster file, by id; every entry needs one here (it names the agent's node)."""
    if any(not entry.id for entry in cluster.nodes):
        raise ClusterFileError(f"{source}: every [[nodes]] entry needs an id")
    return cluster.nodes_by_id()


def agent_node_ids(path: Path) -> list[str]:
    """The nodes of a cluster file that run an agent: all but entries with `agent = false` (a record only: what a
    node the stack does not start, such as a simulated one, may register as)."""
    return [node_id for node_id, entry in load_cluster(path).items() if entry.agent]


def bus_side_address(bus_url: str | None) -> str:
    """The address this machine reaches the bus from (the interface the route to its first server leaves by: a
    UDP socket's connect sends nothing), where other machines find it; 127.0.0.1 without one."""
    server = servers(bus_url)[0] if bus_url else ""
    parts = urlsplit(server if "://" in server else f"nats://{server}")
    if not parts.hostname:
        return "127.0.0.1"
    try:
        family, _, _, _, address = socket.getaddrinfo(parts.hostname, parts.port or 4222, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)
            return str(probe.getsockname()[0]).split("%", 1)[0]  # a link-local address's zone is this host's
    except OSError:
        return "127.0.0.1"


def node_from_config(entry: NodeEntry | Mapping[str, Any], *, virtual: bool, bus_url: str | None = None) -> NodeInfo:
    entry = node_entry(entry)
    gpus: list[Gpu] = []
    for group in entry.gpus:
        for _ in range(group.count):
            gpus.append(Gpu(index=len(gpus), model=group.model, memory_gb=group.memory_gb, tflops=group.tflops))
    return NodeInfo(
        node_id=entry.id,
        kind=entry.kind,
        hostname=socket.gethostname(),
        address=entry.address or bus_side_address(bus_url),
        gpus=tuple(gpus),
        cpu_count=entry.cpu_count if entry.cpu_count is not None else os.cpu_count() or 1,
        memory_gb=entry.memory_gb if entry.memory_gb is not None else 4,
        price_per_hour=entry.price_per_hour,
        labels=entry.all_labels(),
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
            tflops = datasheet_tflops(name)
            gpus.append(Gpu(index=index, model=name, memory_gb=round(memory, 1), tflops=tflops))
        return tuple(gpus)
    finally:
        pynvml.nvmlShutdown()


def describe_node(
    entry: NodeEntry | Mapping[str, Any],
    *,
    use_nvml: bool,
    virtual: bool,
    measure: Callable[[], dict[int, float]] | None = None,
    bus_url: str | None = None,
) -> NodeInfo:
    """The node record to register: real GPUs when NVML finds them (each with its throughput when `measure` is
    given and measures it), the configured ones otherwise; its address its entry's, else the one it reaches the
    bus from (`bus_url`: every rented node's entry names none, and each said 127.0.0.1, so the ranks of a job
    over two rented machines each looked for its master on itself)."""
    node = node_from_config(entry, virtual=virtual, bus_url=bus_url)
    found = gpus_from_nvml() if use_nvml else None
    if found:
        log.info("NVML found %d GPU(s); the cluster file's GPU list is not used", len(found))
        if measure is not None:
            found = with_measured(found, measure())
            log.info(
                "GPU throughput: %s",
                ", ".join(f"{g.index}: {g.measured_tflops} TFLOPS measured, {g.tflops} in the table" for g in found),
            )
        return node.model_copy(update={"gpus": found, "resources_source": "nvml", "virtual": False})
    return node
