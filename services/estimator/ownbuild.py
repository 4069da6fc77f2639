"""The served own-job blend table (`make eta-prior`, after the prior): fitted on every recorded family's readings by
parts built without it (`ownnested`), in the form chosen leave-one-family-out on them (`ownchoice.table_for`); and
the shipped fitted curve (`owncurve.json`). Apart from both so that neither imports the other.

    python -m services.estimator.ownbuild --cache .trainmaster/eta-cache
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

from services.estimator import ownnested
from services.estimator.model import owncorpus
from services.estimator.model.curveprior import blendtable
from services.estimator.model.curveprior.net import PRETRAINED, load as load_prior
from services.estimator.model.owncurve import CALIBRATION
from services.estimator.ownchoice import table_for


def build_table(
    paths: Sequence[Path] = owncorpus.TRAINED, *, cache_dir: Path | None = None, curve_out: Path | None = None
) -> tuple[blendtable.BlendTable | None, int]:
    """The served table: fitted on every recorded family's readings by parts built without it, in the form chosen
    leave-one-family-out on them (`ownchoice.table_for`); (table, rows). With `curve_out`, the shipped fitted curve
    (`shipped_curve`) is written there first."""
    runs = owncorpus.load_corpus(tuple(paths))
    pretrained = load_prior(PRETRAINED)
    if pretrained is None:
        raise ValueError(f"cannot read the pre-trained prior {PRETRAINED}")
    samples, encoded = ownnested.curve_samples(runs, cache_dir), ownnested.prior_samples(runs, cache_dir)
    if curve_out is not None:
        curve = ownnested.cached_json(
            cache_dir,
            f"calibration-all-{ownnested.cache_key(runs)}.json",
            lambda: ownnested.shipped_curve(samples, runs=runs),
        )
        curve_out.write_text(json.dumps(curve, separators=(",", ":")) + "\n")
        print(f"{curve_out}: fitted on {len(runs)} runs", flush=True)
    readings = ownnested.nested_readings(
        runs, pretrained=pretrained, samples=samples, encoded=encoded, cache_dir=cache_dir
    )
    if len(readings.truth) < blendtable.MIN_ROWS:
        return None, len(readings.truth)
    table, form = table_for(readings)
    print(f"form chosen leave-one-family-out on the {len(set(readings.families))} families: {form}", flush=True)
    return table, len(readings.truth)


def main(argv: list[str] | None = None) -> None:
    """`python -m services.estimator.ownbuild`: fit the served blend table (`make eta-prior`, after the prior)."""
    import torch

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--out", type=Path, default=blendtable.TABLE)
    ap.add_argument("--cache", type=Path, help="folder for the per-family fine-tuned priors (reused when present)")
    ap.add_argument("--curve-out", type=Path, default=CALIBRATION, help="the fitted curve's file (owncurve.json)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    started = time.monotonic()
    table, rows = build_table(cache_dir=args.cache, curve_out=args.curve_out)
    if table is None:
        raise SystemExit(f"too few readings ({rows}) to fit a blend table")
    blendtable.save(table, args.out, rows=rows, families_file=[p.name for p in owncorpus.TRAINED])
    print(f"{args.out}: {rows} readings, {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
