"""Hardware assumptions of the simulator: GPU models of the trace and the default on-demand catalogue.

TFLOPS are *effective training* throughput, not datasheet peaks: the A10G's 31.2 FP32 peak counts dual issue and it
trains at about V100 speed, so it is listed at half its peak. G2 and G3 are anonymised in the Alibaba trace; we
assume a mid (G2, most of the trace's nodes) and an upper (G3, 8-GPU, 128-core nodes) class.
"""

from dataclasses import dataclass

from services.placement.policy import InstanceType


@dataclass(frozen=True, slots=True)
class GpuModel:
    memory_gb: float
    tflops: float
    owned_price_per_gpu_hour: float  # amortised purchase + power + admin of one local GPU


GPU_MODELS: dict[str, GpuModel] = {
    "P100": GpuModel(16, 9.3, 0.35),
    "T4": GpuModel(16, 8.1, 0.25),
    "V100M16": GpuModel(16, 15.7, 0.80),
    "V100M32": GpuModel(32, 15.7, 0.95),
    "A10": GpuModel(24, 15.6, 0.55),
    "G2": GpuModel(24, 12.0, 0.60),
    "G3": GpuModel(32, 20.0, 1.00),
}
UNKNOWN_MODEL = GpuModel(16, 10.0, 0.50)
# The trace's run times were measured mostly on G2 nodes, so durations are taken at G2 speed.
REFERENCE_TFLOPS = 12.0
# A one-year reserved cloud GPU costs more per hour than an owned one but well under on-demand.
RESERVED_PRICE_FACTOR = 1.5


def _it(name: str, gpus: int, model: str, cpu: int, memory_gb: int, price: float, startup_s: float) -> InstanceType:
    spec = {"T4": (16, 8.1), "A10G": (24, 15.6), "V100M16": (16, 15.7), "V100M32": (32, 15.7)}[model]
    return InstanceType(name, gpus, model, spec[0], spec[1], cpu, memory_gb, price, startup_s)


# AWS us-east-1 on-demand Linux list prices (USD/hour); startup = boot + image pull + environment setup.
DEFAULT_CATALOGUE: tuple[InstanceType, ...] = (
    _it("g4dn.xlarge", 1, "T4", 4, 16, 0.526, 180),
    _it("g4dn.2xlarge", 1, "T4", 8, 32, 0.752, 180),
    _it("g4dn.4xlarge", 1, "T4", 16, 64, 1.204, 180),
    _it("g4dn.8xlarge", 1, "T4", 32, 128, 2.176, 180),
    _it("g4dn.12xlarge", 4, "T4", 48, 192, 3.912, 240),
    _it("g4dn.metal", 8, "T4", 96, 384, 7.824, 600),
    _it("g5.xlarge", 1, "A10G", 4, 16, 1.006, 180),
    _it("g5.2xlarge", 1, "A10G", 8, 32, 1.212, 180),
    _it("g5.4xlarge", 1, "A10G", 16, 64, 1.624, 180),
    _it("g5.8xlarge", 1, "A10G", 32, 128, 2.448, 180),
    _it("g5.12xlarge", 4, "A10G", 48, 192, 5.672, 240),
    _it("g5.48xlarge", 8, "A10G", 192, 768, 16.288, 300),
    _it("p3.2xlarge", 1, "V100M16", 8, 61, 3.06, 240),
    _it("p3.8xlarge", 4, "V100M16", 32, 244, 12.24, 240),
    _it("p3.16xlarge", 8, "V100M16", 64, 488, 24.48, 300),
    _it("p3dn.24xlarge", 8, "V100M32", 96, 768, 31.212, 300),
)
