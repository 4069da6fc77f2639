"""A compute node as its agent describes it."""
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

NodeKind = Literal["local", "reserved", "on_demand"]
LOCAL_KINDS: frozenset[str] = frozenset({"local"})
CLOUD_KINDS: frozenset[str] = frozenset({"reserved", "on_demand"})


class Gpu(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    index: int = Field(ge=0)
    model: str = Field(examples=["A100-SXM4-80GB"])
    memory_gb: float = Field(ge=0)
    tflops: float = Field(ge=0, description="Dense FP16/BF16 tensor TFLOPS of one GPU.")


class NodeInfo(BaseModel):
    """What a node offers; sent by the agent when it registers."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    node_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    kind: NodeKind
    hostname: str = ""
    address: str = Field("127.0.0.1", description="Where other ranks of a distributed job reach this node.")
    gpus: tuple[Gpu, ...] = ()
    cpu_count: float = Field(gt=0)
    memory_gb: float = Field(gt=0)
    price_per_hour: float = Field(0, ge=0, description="On-demand price, or the amortised price of owned capacity.")
    labels: dict[str, str] = Field(default_factory=dict)
    resources_source: Literal["nvml", "config"] = Field(
        "config", description="nvml: GPUs read from the driver; config: declared in the cluster file (virtual)."
    )
    virtual: bool = Field(False, description="True when several virtual nodes share one real machine.")

    def allows(self, allowed: str) -> bool:
        """Whether a job's `allowed` placement may use this node."""
        return allowed == "any" or (allowed == "local") == (self.kind in LOCAL_KINDS)
