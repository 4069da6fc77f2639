"""Optional helper for training scripts run by trainmaster (standard library only).

    import trainmaster_task as tm
    start = tm.load_step()                   # 0 on the first attempt, the last saved step after a move
    for step in range(start, total):
        ...train...
        tm.report(step=step, loss=loss)      # the estimator reads these lines
        tm.progress()                        # or, printing nothing: a sign of life (no hang suspected)
        if step % 100 == 0 or tm.stop_requested():
            tm.save_step(step)               # write your own files into tm.checkpoint_dir() too
        if tm.stop_requested():              # SIGTERM: save now and exit; the job continues elsewhere
            break

The contract underneath is language-agnostic: TRAINMASTER_CHECKPOINT_DIR is a directory mirrored to checkpoint
storage while the attempt runs and restored before the next one starts; TRAINMASTER_ATTEMPT counts attempts; SIGTERM
means "save now and exit" (the grace period before SIGKILL is the job's spec.termination_grace_s); touching
TRAINMASTER_PROGRESS_FILE marks progress (a job with no output, progress mark or new checkpoint for its
spec.hang_timeout_s is suspected hung).
"""

import json
import os
import signal
import sys
from pathlib import Path

_stop = False


def _on_sigterm(signum: int, frame: object) -> None:
    global _stop
    _stop = True


if hasattr(signal, "SIGTERM"):
    signal.signal(signal.SIGTERM, _on_sigterm)


def checkpoint_dir() -> Path:
    """Where to keep checkpoints (a local temporary directory outside trainmaster)."""
    path = Path(os.environ.get("TRAINMASTER_CHECKPOINT_DIR", ".trainmaster-checkpoint"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def attempt() -> int:
    return int(os.environ.get("TRAINMASTER_ATTEMPT", "1"))


def stop_requested() -> bool:
    """True once trainmaster asked the task to save and exit (SIGTERM)."""
    return _stop


def report(**metrics: float) -> None:
    """One line of metrics (and `step`), which the estimator turns into points of the job's curve; `total_steps`
    (or `max_steps`, `epochs`, ... in the units of `step`) tells it how much work the run has, for an ETA from the
    rate alone."""
    sys.stdout.write("TRAINMASTER_METRICS " + json.dumps(metrics) + "\n")
    sys.stdout.flush()


def progress() -> None:
    """A progress mark without output: touches TRAINMASTER_PROGRESS_FILE, which the agent's hang detection reads."""
    path = os.environ.get("TRAINMASTER_PROGRESS_FILE")
    if path:
        Path(path).touch()


def atomic_write(path: Path, data: bytes) -> None:
    """Write a file so that a sync never sees half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def save_step(step: int, **state: object) -> None:
    atomic_write(checkpoint_dir() / "trainmaster-step.json", json.dumps({"step": step, **state}).encode())


def load_step(default: int = 0) -> int:
    path = checkpoint_dir() / "trainmaster-step.json"
    return int(json.loads(path.read_text())["step"]) if path.exists() else default
