"""The accelerator's numbers (peak dense TFLOPS, memory and interconnect bandwidth) and the history model using them."""

import numpy as np
import pytest
from eta_factories import make_run

from services.estimator import evaluate
from services.estimator.model.features import JobFeatures, features_from_run
from services.estimator.model.hardware import GENERATIONS, TABLE, Hardware, generation, hardware
from services.estimator.model.history import HistoryPredictor

# Every accelerator model name of the MLPerf Training v3.1 and v4.0 results, as their systems files spell them.
ROUND_NAMES = (
    "NVIDIA H100-SXM5-80GB",
    "NVIDIA H100-PCIe-80GB",
    "NVIDIA L40",
    "NVIDIA A30",
    "NVIDIA H100-SXM5-96GB",
    "NVIDIA A100-PCIe-80GB",
    "Intel Gaudi2",
    "NVIDIA L40S",
    "NVIDIA RTX A5000",
    "NVIDIA L4",
    "NVIDIA H100-SXM-80GB",
    "NVIDIA A100 - PCIe - 80 GB",
    "NVIDIA A100-SXM-40GB",
    "NVIDIA A10G",
    "TPU-v5e",
    "NVIDIA H200-SXM5-141GB",
    "NVIDIA A100-SXM4-80GB",
    "Intel(R) Gaudi(R) 2 AI Accelerator",
    "TPU-v5p",
    "AMD Radeon RX 7900 XTX",
    "NVIDIA GeForce RTX 4090",
)


@pytest.mark.parametrize("name", ROUND_NAMES)
def test_every_accelerator_of_both_rounds_has_its_datasheet_numbers(name):
    known = hardware(name)
    assert known is not None and known.source == "table"
    assert known.tflops > 0 and known.memory_gbps > 0 and known.link_gbps > 0


def test_spellings_and_variants_read_as_their_part():
    assert hardware("NVIDIA H100-SXM5-80GB") == hardware("nvidia h100 sxm 80gb")
    assert hardware("NVIDIA H200-SXM5-141GB").memory_gbps > hardware("NVIDIA H100-SXM5-80GB").memory_gbps
    assert hardware("NVIDIA H100-PCIe-80GB").link_gbps < hardware("NVIDIA H100-SXM5-80GB").link_gbps
    assert hardware("NVIDIA A100-SXM-40GB").memory_gbps < hardware("NVIDIA A100-SXM4-80GB").memory_gbps


def test_a_name_the_table_lacks_is_read_by_its_family():
    blackwell, h800_pcie = hardware("NVIDIA B100"), hardware("NVIDIA H800 PCIe")
    assert blackwell.source == "family" and blackwell.tflops > hardware("NVIDIA H100-SXM5-80GB").tflops
    assert h800_pcie == Hardware(756.0, 2000.0, 128.0, "family")  # Hopper's PCIe card
    assert hardware("AMD Instinct MI325X").source == "family"
    assert hardware("N/A") is None and hardware("Some New Chip") is None


def test_features_carry_the_bandwidths():
    feat = JobFeatures(benchmark="bert", accelerator="TPU-v5p", accelerators=4).resolved()
    assert (feat.tflops, feat.memory_gbps, feat.link_gbps) == (459.0, 2765.0, 600.0)
    unknown = JobFeatures(benchmark="bert", accelerator="Some New Chip").resolved()
    assert unknown.tflops is None and unknown.memory_gbps is None


TRAINED_ON = ("NVIDIA H100-SXM5-80GB", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S", "NVIDIA L4", "NVIDIA H100-PCIe-80GB")


def memory_bound_corpus():
    """Runs whose speed is set by memory bandwidth, not by TFLOPS: a benchmark bound by its memory traffic."""
    rng = np.random.default_rng(1)
    runs = []
    for i in range(100):
        bench = ("bert", "resnet")[i % 2]
        accel = TRAINED_ON[(i // 2) % len(TRAINED_ON)]
        count = (8, 16)[(i // 10) % 2]
        work = {"bert": 3000.0, "resnet": 40.0}[bench] * rng.uniform(0.98, 1.02)
        rate = {"bert": 1.0, "resnet": 0.01}[bench] * hardware(accel).memory_gbps * count / 8000
        runs.append(
            make_run(
                benchmark=bench,
                submitter=f"org{i % 4}",
                work=work,
                rate=rate,
                accelerator=accel,
                accelerators_per_node=count,
                evals=4,
                run_id=f"v4.0/org{i % 4}/s/{bench}/{i}",
            )
        )
    return runs


def test_an_accelerator_never_trained_on_is_predicted_from_its_numbers():
    # Gaudi2 has A100's class of TFLOPS but more memory bandwidth: in a memory-bound world it runs 0.83x an A100's
    # time. By TFLOPS alone (the former model) it came out 2-3x long.
    model = HistoryPredictor(epochs=300).train(memory_bound_corpus(), folds=1)
    truth = make_run(
        benchmark="bert",
        work=3000.0,
        accelerator="Intel Gaudi2",
        accelerators_per_node=8,
        rate=hardware("Intel Gaudi2").memory_gbps * 8 / 8000,
    )
    predicted = model.predict(features_from_run(truth))[0]
    assert predicted == pytest.approx(truth.duration_s, rel=0.25)


def test_accelerator_split_holds_out_each_accelerator_model_under_every_spelling():
    runs = [
        make_run(accelerator=a, run_id=f"v3.1/o/s/bert/{i}")
        for i, a in enumerate(("NVIDIA H100-SXM5-80GB", "H100-SXM-80GB", "NVIDIA L40S", "Intel Gaudi2"))
    ]
    folds = evaluate.split_kfold(runs, runs, k=3, by="accelerator")
    assert sorted(w for fold in folds for w in fold) == ["gaudi", "h100", "l40s"]
    assert evaluate.split_key(runs[0], "accelerator") == evaluate.split_key(runs[1], "accelerator")


def test_generation_split_holds_out_a_whole_generation_its_newer_parts_and_families_included():
    names = ("NVIDIA H100-SXM5-80GB", "NVIDIA H200-SXM5-141GB", "NVIDIA GH200", "NVIDIA H20", "TPU-v5e", "TPU-v5p")
    runs = [make_run(accelerator=a, run_id=f"v3.1/o/s/bert/{i}") for i, a in enumerate((*names, "NVIDIA L40S"))]
    folds = evaluate.split_kfold(runs, runs, k=3, by="generation")
    assert sorted(w for fold in folds for w in fold) == ["ada", "hopper", "tpu"]
    assert {evaluate.split_key(r, "generation") for r in runs[:4]} == {"hopper"}  # H20: by its family's pattern
    assert evaluate.split_key(runs[4], "generation") == evaluate.split_key(runs[5], "generation")


def test_every_row_of_the_table_has_a_generation_and_a_part_nobody_knows_is_one_of_its_own():
    assert {generation(" ".join(needles)) for needles, *_ in TABLE} == {gen for gen, _ in GENERATIONS}
    assert generation("Acme Matrix-9") == "acmematrix9" != generation("Other Chip")
    assert generation("") == "unknown"


@pytest.mark.parametrize(
    "name", ["", "x" * 100_000, "b" + "9" * 50_000, "NVIDIA\x00H100\u202e", "(r)" * 1000, "🚀 GPU"]
)
def test_a_node_claiming_any_name_gets_numbers_or_none_never_an_error(name):
    known = hardware(name)  # the name is the node's claim (TaskStarted.gpu_model) or the job's declaration
    assert isinstance(generation(name), str)
    assert known is None or (known.tflops > 0 and known.memory_gbps > 0 and known.link_gbps > 0)
