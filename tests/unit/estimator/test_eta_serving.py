"""The estimator's history model is trained in a background process of its own: at lower priority, with torch held
to the configured threads, on the CPU; the estimator serves it without torch."""

import asyncio
import subprocess
import sys
from pathlib import Path

from services.estimator import modelstore
from services.estimator.app import EstimatorSettings
from services.estimator.modelstore import ModelStore

REPO = Path(__file__).resolve().parents[3]


async def test_training_is_started_with_the_configured_torch_threads(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.tar.gz"
    corpus.write_bytes(b"")
    seen, real = [], asyncio.create_subprocess_exec

    async def spawn(*argv, **_):
        seen.append(argv)
        return await real("true")

    monkeypatch.setattr(modelstore.asyncio, "create_subprocess_exec", spawn)
    await ModelStore(directory=tmp_path / "models", corpus=[corpus], threads=2).train()
    [argv] = seen
    assert argv[argv.index("--threads") + 1] == "2" and argv[argv.index("--out") + 1].endswith("history-v1.npz")
    assert EstimatorSettings.model_fields["train_threads"].default == 1


def test_the_training_process_lowers_its_priority_and_bounds_torchs_threads():
    code = (
        "import os, torch; before = os.nice(0); from services.estimator.train import settle; settle(1); "
        "from services.estimator.train import BACKGROUND_NICE; "
        "print(torch.get_num_threads(), torch.get_num_interop_threads(), "
        "os.nice(0) == min(19, max(before, BACKGROUND_NICE)))"
    )  # a suite run under `nice` starts niced already
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.split() == ["1", "1", "True"]
