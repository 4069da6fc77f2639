"""Learn the own-job ETA's calibration from the recorded sweep; writes `services/estimator/model/owncurve.json`.

The networks are trained on the calibration split only (`owncorpus.HELD_OUT_SEEDS` are never read), see
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
    parser.add_argument("--sweep", type=Path, nargs="+", default=list(owncorpus.TRAINED))
    parser.add_argument("--metrics", default="loss,val_loss,val_acc")
    parser.add_argument("--out", type=Path, default=CALIBRATION)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    started = time.monotonic()
    table = calibrate(owncorpus.load_corpus(args.sweep), [m.strip() for m in args.metrics.split(",")])
    args.out.write_text(json.dumps(table, separators=(",", ":")) + "\n")
    print(
        f"{args.out}: {len(table['nets'])} networks on {table['fit_samples']} samples of {table['runs']} runs, "
        f"pads {table['pads']}, {time.monotonic() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
