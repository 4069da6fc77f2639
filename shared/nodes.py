"""A compute node as its agent describes it."""

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

NodeKind = Literal["local", "reserved", "on_demand"]
LOCAL_KINDS: frozenset[str] = frozenset({"local"})
CLOUD_KINDS: frozenset[str] = frozenset({"reserved", "on_demand"})
# Tasks run as uids from here up when their agent is root (an operator may start them elsewhere:
# TRAINMASTER_TASK_UID_FIRST); below are the host's people and daemons.
TASK_UID_FLOOR = 200_000
# A measured GPU may beat its datasheet by this much (a boost clock), no more: past it the figure is not believed.
MEASURED_SLACK = 1.1

# Dense BF16 tensor TFLOPS by model name, from the vendors' datasheets: what an agent reports for a GPU it finds
# through NVML (the driver does not say), and the most a node whose record gives no GPU speed may claim for a GPU of
# that name (an unknown name: 0, as an agent reports it). A key matches a whole word or words of the name, in any
# case ("NVIDIA L40" is no L4, "RTX A1000" no A100, "T400" no T4); the first key that matches wins.
DATASHEET_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GH200", 989.0),
    ("H200 NVL", 835.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("L4", 121.0),
    ("V100", 125.0),
    ("T4", 65.0),
    ("RTX 4090", 165.0),
    ("RTX 3090", 71.0),
    ("A6000", 155.0),
)
_DATASHEET = tuple(
    (re.compile(rf"(?<![a-z0-9]){re.escape(key.lower())}(?![a-z0-9])"), tflops) for key, tflops in DATASHEET_TFLOPS
)


def datasheet_tflops(model: str) -> float:
    """A GPU model's datasheet TFLOPS (`DATASHEET_TFLOPS`), 0.0 for a name it does not know."""
    name = " ".join(model.lower().split())
    return next((tflops for key, tflops in _DATASHEET if key.search(name)), 0.0)


HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})")
ZONE = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # an IPv6 address's interface
# What no machine has: a node's claim past them (or not finite) is refused. An infinite GPU memory drew every large
# job to the node that claimed it and made `GET /v2/nodes` fail (found by review); the cluster file's figures bound
# each claim further (`shared.noderecords`).
MAX_GPU_INDEX = 63
MAX_GPU_MEMORY_GB = 1024.0
MAX_TFLOPS = 100_000.0
MAX_CPUS = 65_536.0
MAX_MEMORY_GB = 65_536.0
MAX_PRICE_PER_HOUR = 1_000_000.0
Tflops = Annotated[float, Field(ge=0, le=MAX_TFLOPS, allow_inf_nan=False)]
Price = Annotated[float, Field(ge=0, le=MAX_PRICE_PER_HOUR, allow_inf_nan=False)]  # dollars an hour


class Gpu(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    index: int = Field(ge=0, le=MAX_GPU_INDEX)
    model: str = Field(max_length=128, examples=["A100-SXM4-80GB"])
    memory_gb: float = Field(ge=0, le=MAX_GPU_MEMORY_GB, allow_inf_nan=False)
    tflops: Tflops = Field(description="Dense FP16/BF16 tensor TFLOPS of one GPU (the table's figure).")
    measured_tflops: Tflops | None = Field(
        None, description="Dense BF16 matmul TFLOPS the agent measured at start (None: not measured)."
    )

    @property
    def speed(self) -> float:
        """The TFLOPS placement and the estimator plan with: the measured figure, never more than the table's by
        MEASURED_SLACK (a measurement is the node's claim); the table's without one or without a table figure."""
        if self.measured_tflops is None or self.tflops <= 0:
            return self.tflops
        return min(self.measured_tflops, self.tflops * MEASURED_SLACK)


class NodeInfo(BaseModel):
    """What a node offers; sent by the agent when it registers."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    node_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    kind: NodeKind
    hostname: str = Field("", max_length=253)
    address: str = Field(
        "127.0.0.1",
        max_length=253,
        description="Where other ranks of a distributed job reach this node (an IP address or a host name).",
    )
    gpus: tuple[Gpu, ...] = Field((), max_length=MAX_GPU_INDEX + 1)
    cpu_count: float = Field(gt=0, le=MAX_CPUS, allow_inf_nan=False)
    memory_gb: float = Field(gt=0, le=MAX_MEMORY_GB, allow_inf_nan=False)
    price_per_hour: Price = Field(0, description="On-demand price, or the amortised price of owned capacity.")
    labels: dict[str, str] = Field(default_factory=dict, max_length=64)
    resources_source: Literal["nvml", "config"] = Field(
        "config", description="nvml: GPUs read from the driver; config: declared in the cluster file (virtual)."
    )
    virtual: bool = Field(False, description="True when several virtual nodes share one real machine.")

    @field_validator("address")
    @classmethod
    def _an_address(cls, value: str) -> str:
        """An IP address (IPv6 too, with a zone id) or a host name: no text a launch would pass on as something
        else (spaces, line breaks, shell or URL syntax)."""
        try:
            ipaddress.ip_address(value.split("%", 1)[0])
        except ValueError:
            if not HOST_NAME.fullmatch(value):
                raise ValueError(f"{value!r} is neither an IP address nor a host name") from None
        if "%" in value and not ZONE.fullmatch(value.split("%", 1)[1]):
            raise ValueError(f"{value!r}: its zone id is no interface name")
        return value

    def allows(self, allowed: str) -> bool:
        """Whether a job's `allowed` placement may use this node."""
        return allowed == "any" or (allowed == "local") == (self.kind in LOCAL_KINDS)
