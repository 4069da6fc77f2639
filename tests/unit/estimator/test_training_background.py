"""The history model's training stays in the background: a process of its own at lower priority, every thread pool
of numpy and torch bounded from its first instruction (they size themselves when they load, one thread a core)."""

import asyncio
import json
import os
import subprocess
import sys

from services.estimator import modelstore
from services.estimator.modelstore import ModelStore
from services.estimator.train import BACKGROUND_NICE

PROBE = (
    "import json, os, threadpoolctl, numpy, torch; print(json.dumps({'nice': os.nice(0), 'torch': "
    "torch.get_num_threads(), 'pools': {i['internal_api']: i['num_threads'] for i in "
    "threadpoolctl.threadpool_info()}}))"
)


def test_the_training_process_starts_niced_with_every_thread_pool_bounded(tmp_path, monkeypatch):
    (tmp_path / "corpus.tar.gz").write_bytes(b"")
    started = {}

    async def capture(*argv, **kwargs):
        started.update(argv=argv, **kwargs)

    monkeypatch.setattr(modelstore.asyncio, "create_subprocess_exec", capture)
    asyncio.run(ModelStore(directory=tmp_path / "models", corpus=[tmp_path / "corpus.tar.gz"], threads=1).train())
    assert started["argv"][1:3] == ("-m", "services.estimator.train")
    # what that process would see: the same start, running a probe instead of the training
    probe = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=started["env"],
        preexec_fn=started["preexec_fn"],
        capture_output=True,
        text=True,
        check=True,
    )
    seen = json.loads(probe.stdout)
    assert seen["nice"] == min(19, os.nice(0) + BACKGROUND_NICE)
    assert seen["torch"] == 1
    assert seen["pools"] and set(seen["pools"].values()) == {1}, seen["pools"]  # OpenBLAS's and OpenMP's included
