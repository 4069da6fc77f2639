"""The served own-job blend table (`make eta-prior`, after the prior): fitted on every recorded family's readings by
parts built without it (`ownnested`), in the form chosen leave-one-family-out on them (`ownchoice.table_for`); and
the shipped fitted curve (`owncurve.json`). Apart from both so that neither imports the other.

    python -m services.estimator.ownbuild --cache .trainmaster/eta-cache --jobs 2
    python -m services.estimator.ownbuild --families conv-images,epoch-acc,gru-text --out /tmp/b.json \
        --curve-out /tmp/c.json          # a reduced build (three folds), to time or try a change on
    python -m services.estimator.ownbuild --power-fit tail ...   # the fitted curve's power law weighed to its tail
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Collection, Sequence
from pathlib import Path

from services.estimator import ownnested
from services.estimator.model import owncorpus
from services.estimator.model.curveprior import blendtable
from services.estimator.model.curveprior.net import PRETRAINED, load as load_prior
from services.estimator.model.owncurve import CALIBRATION, PLAIN, POWER_FITS
from services.estimator.ownchoice import table_for


def build_table(
    paths: Sequence[Path] = owncorpus.TRAINED,
    *,
    cache_dir: Path | None = None,
    curve_out: Path | None = None,
    jobs: int = 1,
    families: Collection[str] = (),
    power_fit: str = PLAIN,
) -> tuple[blendtable.BlendTable | None, int]:
    """The served table: fitted on every recorded family's readings by parts built without it, in the form chosen
    leave-one-family-out on them (`ownchoice.table_for`); (table, rows). With `curve_out`, the shipped fitted curve
    (`shipped_curve`) is written there first. `jobs`: processes the families' samples, the fitted curve's networks
    and the folds are made in (the same parts whatever the number); `families`: only those (a reduced build);
    `power_fit`: the fitted curve's power law (`owncurve.power_crossing`), recorded in the fitted curve's file."""
    runs = owncorpus.load_corpus(tuple(paths))
    if families:
        unknown = set(families) - {owncorpus.family(r) for r in runs}
        if unknown:
            raise ValueError(f"param[families] invalid: no runs of {sorted(unknown)}")
        runs = [r for r in runs if owncorpus.family(r) in families]
    pretrained = load_prior(PRETRAINED)
    if pretrained is None:
        raise ValueError(f"cannot read the pre-trained prior {PRETRAINED}")
    samples = ownnested.curve_samples(runs, cache_dir, jobs=jobs, power_fit=power_fit)
    encoded = ownnested.prior_samples(runs, cache_dir, jobs=jobs)
    if curve_out is not None:
        curve = ownnested.cached_json(
            cache_dir,
            f"calibration-all-{ownnested.cache_key(runs, power_fit)}.json",
            lambda: ownnested.shipped_curve(samples, runs=runs, jobs=jobs, power_fit=power_fit),
        )
        curve_out.write_text(json.dumps(curve, separators=(",", ":")) + "\n")
        print(f"{curve_out}: fitted on {len(runs)} runs", flush=True)
    readings = ownnested.nested_readings(
        runs,
        pretrained=pretrained,
        samples=samples,
        encoded=encoded,
        cache_dir=cache_dir,
        jobs=jobs,
        power_fit=power_fit,
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
    ap.add_argument("--jobs", type=int, default=1, help="processes the folds are built in (the same table)")
    ap.add_argument(
        "--families", type=lambda v: set(v.split(",")), default=set(), help="only these families (a reduced build)"
    )
    ap.add_argument(
        "--power-fit",
        choices=POWER_FITS,
        default=PLAIN,
        help="the fitted curve's power law: every residual alike (shipped) or each over its way left to the target",
    )
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("argument --jobs: must be at least 1")
    if args.families and (args.out == blendtable.TABLE or args.curve_out == CALIBRATION):
        ap.error("argument --families: a reduced build writes elsewhere than the shipped files (--out, --curve-out)")
    torch.set_num_threads(1)
    started = time.monotonic()
    table, rows = build_table(
        cache_dir=args.cache,
        curve_out=args.curve_out,
        jobs=args.jobs,
        families=args.families,
        power_fit=args.power_fit,
    )
    if table is None:
        raise SystemExit(f"too few readings ({rows}) to fit a blend table")
    blendtable.save(table, args.out, rows=rows, families_file=[p.name for p in owncorpus.TRAINED])
    used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum(u.ru_utime + u.ru_stime for u in used)
    print(f"{args.out}: {rows} readings, {time.monotonic() - started:.0f} s, {cpu:.0f} s of CPU")


if __name__ == "__main__":
    main()
