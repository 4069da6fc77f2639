"""What an accelerator can do, by numbers: peak dense 16-bit TFLOPS, memory and interconnect bandwidth.

The history model predicts a run's duration from these numbers, not from the accelerator's name, so a GPU
generation it never trained on is a point between (or beyond) the ones it did, not an unknown word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    """One accelerator's peak dense BF16/FP16 tensor TFLOPS, memory bandwidth and per-device interconnect (GB/s)."""

    tflops: float
    memory_gbps: float
    link_gbps: float
    source: str  # "table": the exact model; "family": a name the table lacks, read by its generation


# Rows: (substrings that must all be in the squeezed name, TFLOPS, memory GB/s, interconnect GB/s), first match
# wins, so a narrower row comes before a wider one. Interconnect is what every device of a node reaches the others
# with: NVLink/NVSwitch, Infinity Fabric, Gaudi's on-chip RoCE, TPU ICI; PCIe where NVLink is only a bridge between
# pairs (H100/A100 PCIe cards) or absent. Sources (vendor datasheets, dense = without 2:4 sparsity):
# H100 SXM/PCIe: NVIDIA H100 Tensor Core GPU datasheet (989/756 TFLOPS BF16, 3,350/2,000 GB/s, NVLink 900, PCIe
#   Gen5 128); H100 96 GB HBM3 (GH200 Grace Hopper Superchip datasheet: 4,000 GB/s); H200: NVIDIA H200 datasheet
#   (989, 4,800 GB/s, NVLink 900); A100: NVIDIA A100 datasheet (312; 80 GB SXM 2,039, 40 GB 1,555, 80 GB PCIe
#   1,935 GB/s; NVLink 600, PCIe Gen4 64); A30: A30 datasheet (165, 933, PCIe Gen4 64); L40 / L40S / L4: their
#   datasheets (181 / 362 / 121 TFLOPS dense, 864 / 864 / 300 GB/s, PCIe Gen4 64); A10G: AWS G5 (70, 600, 64);
#   RTX A5000: datasheet (111, 768, PCIe Gen4 64); RTX 4090: Ada Lovelace architecture whitepaper (165 FP16 tensor
#   with FP32 accumulate, 1,008 GB/s, PCIe Gen4 64); Radeon RX 7900 XTX: AMD RDNA 3 specifications (123 FP16,
#   960 GB/s, PCIe Gen4 64); Instinct MI300X: AMD datasheet (1,307, 5,300, Infinity Fabric 896); Gaudi2: Intel
#   Gaudi 2 white paper (432 BF16, 2,450 GB/s, 24 x 100 GbE = 300); Gaudi3: Intel Gaudi 3 white paper (1,835,
#   3,700, 24 x 200 GbE = 600); TPU v5e / v5p: Google Cloud TPU system architecture pages (197 / 459 BF16, 819 /
#   2,765 GB/s, ICI 200 / 600 GB/s per chip); B200: NVIDIA DGX B200 datasheet per GPU (2,250 dense BF16, 8,000
#   GB/s, NVLink 1,800).
TABLE: tuple[tuple[tuple[str, ...], float, float, float], ...] = (
    (("gh200",), 989.0, 4000.0, 900.0),
    (("h200",), 989.0, 4800.0, 900.0),
    (("h100", "pcie"), 756.0, 2000.0, 128.0),
    (("h100", "96gb"), 989.0, 4000.0, 900.0),
    (("h100",), 989.0, 3350.0, 900.0),
    (("a100", "pcie"), 312.0, 1935.0, 64.0),
    (("a100", "40gb"), 312.0, 1555.0, 600.0),
    (("a100",), 312.0, 2039.0, 600.0),
    (("a30",), 165.0, 933.0, 64.0),
    (("l40s",), 362.0, 864.0, 64.0),
    (("l40",), 181.0, 864.0, 64.0),
    (("l4",), 121.0, 300.0, 64.0),
    (("a10g",), 70.0, 600.0, 64.0),
    (("a5000",), 111.0, 768.0, 64.0),
    (("4090",), 165.0, 1008.0, 64.0),
    (("7900",), 123.0, 960.0, 64.0),
    (("mi300",), 1307.0, 5300.0, 896.0),
    (("gaudi3",), 1835.0, 3700.0, 600.0),
    (("gaudi",), 432.0, 2450.0, 300.0),
    (("v5p",), 459.0, 2765.0, 600.0),
    (("v5e",), 197.0, 819.0, 200.0),
    (("b200",), 2250.0, 8000.0, 1800.0),
)

# A name the table lacks, read by its generation: (pattern on the name, the row it borrows, the row a PCIe card of
# the family borrows). A newer part of a known family is closer to its family's flagship than to "unknown".
FAMILIES: tuple[tuple[re.Pattern, tuple[str, ...], tuple[str, ...]], ...] = (
    (re.compile(r"\bg?b\d{3}|blackwell"), ("b200",), ("b200",)),
    (re.compile(r"\bg?h\d{2,3}\b|hopper"), ("h100",), ("h100", "pcie")),
    (re.compile(r"\ba\d{3}\b|ampere"), ("a100",), ("a100", "pcie")),
    (re.compile(r"\ba\d{2}\b"), ("a100", "pcie"), ("a100", "pcie")),  # A10, A40: PCIe cards
    (re.compile(r"\bl\d{1,2}s?\b|rtx ?40\d\d|\bada\b"), ("l40",), ("l40",)),
    (re.compile(r"\bmi\d{3}"), ("mi300",), ("mi300",)),
    (re.compile(r"gaudi"), ("gaudi",), ("gaudi",)),
    (re.compile(r"tpu"), ("v5e",), ("v5e",)),
    (re.compile(r"radeon|rx\d{4}"), ("7900",), ("7900",)),
)


# Each table row's generation (its first needle's): what a leave-one-generation-out split holds out together, so a
# new generation is tested as one (H200 and GH200 out with H100, TPU v5p with v5e), not as a sibling of a seen part.
GENERATIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("blackwell", ("b200",)),
    ("hopper", ("gh200", "h200", "h100")),
    ("ampere", ("a100", "a30", "a10g", "a5000")),
    ("ada", ("l40s", "l40", "l4", "4090")),
    ("cdna", ("mi300",)),
    ("gaudi", ("gaudi3", "gaudi")),
    ("tpu", ("v5p", "v5e")),
    ("rdna", ("7900",)),
)

PCIE_GEN5_GBPS = 128.0  # the most a PCIe card of a family the table lacks is given to reach the others


def squeeze(name: str) -> str:
    """Lower case, no spaces, no "(R)": "NVIDIA H100-SXM5-80GB" and "nvidia h100 - sxm5 - 80 gb" read alike."""
    return name.lower().replace(" ", "").replace("(r)", "")


def _row(needles: tuple[str, ...]) -> tuple[float, float, float]:
    return next((t, m, link) for n, t, m, link in TABLE if n == needles)


def hardware(name: str) -> Hardware | None:
    """The accelerator's numbers: the table's row, else its family's (a PCIe card's: PCIe's link); None when
    neither knows the name."""
    key = squeeze(name)
    for needles, tflops, memory, link in TABLE:
        if all(n in key for n in needles):
            return Hardware(tflops, memory, link, "table")
    spaced = re.sub(r"[-_/,]", " ", name.lower().replace("(r)", ""))
    for pattern, needles, pcie in FAMILIES:
        if pattern.search(spaced):
            tflops, memory, link = _row(pcie if "pcie" in key else needles)
            return Hardware(tflops, memory, min(link, PCIE_GEN5_GBPS) if "pcie" in key else link, "family")
    return None


def generation(name: str) -> str:
    """The accelerator's generation word (`GENERATIONS`: the table's row, else its family's), else its squeezed
    name: a part no row or family knows is a generation of its own."""
    key = squeeze(name)
    row = next((needles for needles, *_ in TABLE if all(n in key for n in needles)), None)
    if row is None:
        spaced = re.sub(r"[-_/,]", " ", name.lower().replace("(r)", ""))
        row = next((needles for pattern, needles, _ in FAMILIES if pattern.search(spaced)), None)
    if row is None:
        return key.replace("-", "") or "unknown"
    return next(gen for gen, firsts in GENERATIONS if row[0] in firsts)
