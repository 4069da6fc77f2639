"""Learn the own-job ETA's calibration from the recorded sweep; writes `services/estimator/model/owncurve.json`.

The network is trained on the calibration split only (`owncorpus.HELD_OUT_SEEDS` are never read), see
`services/estimator/model/owntrain.py`.

    nice -n 10 .venv/bin/python -m bench.search.calibrate        # --metrics loss,val_loss,val_acc
"""
import argparse
import json
import time
from pathlib import Path

import torch

from services.estimator.model import owncorpus
from services.estimator.model.owncurve import CALIBRATION
from services.estimator.model.owntrain import calibrate


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=Path, default=owncorpus.SWEEP)
    parser.add_argument("--metrics", default="loss,val_loss,val_acc")
    parser.add_argument("--out", type=Path, default=CALIBRATION)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    started = time.monotonic()
    table = calibrate(owncorpus.load_sweep(args.sweep), [m.strip() for m in args.metrics.split(",")])
    args.out.write_text(json.dumps(table, separators=(",", ":")) + "\n")
    print(f"{args.out}: {table['fit_samples']} samples from {table['fit_cases']} cases, pad {table['pad']:+.3f}, "
          f"{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
