"""Versioned history models on disk: the newest is served; a new one is trained in the background each time
enough jobs have completed (corpus + those jobs). Until one is, the model shipped with trainmaster is served
(`shipped.py`, version 0); a model is trained at first start only where none can be served (the shipped one
removed, or of another format)."""

import asyncio
import json
import logging
import os
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from shared.children import dies_with_parent
from services.estimator.model import HistoryPredictor
from services.estimator.train import background, background_env

log = logging.getLogger(__name__)
VERSION = re.compile(r"^history-v(\d+)\.npz$")  # a numpy file: served without torch (older .pt files: ignored)


@dataclass
class ModelStore:
    directory: Path
    corpus: list[Path]
    shipped: Path | None = None  # served as version 0 while the directory holds none
    retrain_every: int = 20
    threads: int = 1  # torch's CPU threads in the training process
    predictor: HistoryPredictor | None = None
    version: int | None = None
    training: asyncio.subprocess.Process | None = field(default=None, repr=False)
    refused: set[tuple[Path, int, int]] = field(default_factory=set, repr=False)  # files that did not load

    def versions(self) -> list[int]:
        if not self.directory.exists():
            return []
        return sorted(int(m.group(1)) for p in self.directory.iterdir() if (m := VERSION.match(p.name)))

    def load_latest(self) -> bool:
        """Serve the newest model that loads: on disk, else the shipped one (a model on disk of an older format,
        after an upgrade, is passed over, not served and not a reason to train at start); True when it changed."""
        candidates = [(v, self.directory / f"history-v{v}.npz") for v in reversed(self.versions())]
        if self.shipped is not None:
            candidates.append((0, self.shipped))
        for version, path in candidates:
            if self.version is not None and version <= self.version:
                return False  # the served one is the newest that loads
            try:
                stat = path.stat()
            except OSError:
                continue
            seen = (path, stat.st_mtime_ns, stat.st_size)  # a file refused once is tried again only if it changed
            if seen in self.refused:
                continue
            try:
                predictor = HistoryPredictor.load(path)
            except (ValueError, OSError) as exc:  # another format version, or half a file: keep what we have
                self.refused.add(seen)
                log.warning("history model %s not usable: %r", path, exc)
                continue
            self.predictor, self.version = predictor, version
            log.info("serving history model v%d (%s)", version, path)
            return True
        return False

    def status(self) -> dict:
        """What an operator asks: which version is served, which are on disk, whether one is being trained."""
        return {
            "version": self.version,
            "on_disk": self.versions(),
            "shipped": self.version == 0,
            "training": self.training is not None and self.training.returncode is None,
        }

    async def train(self, runs: list[dict] | None = None) -> None:
        """Start training the next version in a process of its own (one at a time)."""
        if self.training is not None and self.training.returncode is None:
            return
        corpus = [str(p) for p in self.corpus if p.exists()]
        if not corpus and not runs:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        out = self.directory / f"history-v{(self.versions() or [0])[-1] + 1}.npz"
        argv = [
            sys.executable,
            "-m",
            "services.estimator.train",
            "--out",
            str(out),
            "--threads",
            str(self.threads),
            "--corpus",
            *corpus,
        ]
        if runs:
            extra = self.directory / "completed-runs.json"
            extra.write_text(json.dumps(runs))
            argv += ["--runs", str(extra)]
        log.info(
            "training history model %s on %d tarball(s) and %d completed job(s)", out.name, len(corpus), len(runs or [])
        )
        dies = dies_with_parent(signal.SIGKILL)  # a training whose estimator died is of no use

        def preexec() -> None:
            background()
            if dies is not None:
                dies()

        self.training = await asyncio.create_subprocess_exec(
            *argv,
            stdout=(self.directory / "training.log").open("ab"),
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **background_env(self.threads)},
            preexec_fn=preexec,
        )


async def refresh_forever(store: ModelStore, *, interval_s: float = 5.0) -> None:
    """Pick up newly trained versions; train the first one if none can be served (not even the shipped one)."""
    store.load_latest()
    if store.version is None:
        await store.train()
    while True:
        await asyncio.sleep(interval_s)
        store.load_latest()
