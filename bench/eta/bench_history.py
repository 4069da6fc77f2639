"""Training time of the history MLP (+ blend calibration) on the corpus, predict cost, RSS."""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

from services.estimator.model.calibrate import train_with_calibration
from services.estimator.model.corpus import default_tarballs, load_corpora
from services.estimator.model.features import features_from_run
from services.estimator.model.history import HistoryPredictor


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("tarballs", nargs="*", default=[str(p) for p in default_tarballs()])
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    runs = load_corpora(args.tarballs)
    t1 = time.perf_counter()
    HistoryPredictor().train(runs, folds=3)
    t2 = time.perf_counter()
    model = train_with_calibration(runs)
    t3 = time.perf_counter()
    feats = [features_from_run(r) for r in runs[:500]]
    for f in feats:
        model.predict(f)
    t4 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "history.npz"
        model.save(path)
        size_kb = path.stat().st_size / 1024
        HistoryPredictor.load(path)
    print(
        json.dumps(
            {
                "runs": len(runs),
                "load_corpus_s": round(t1 - t0, 2),
                "train_mlp_s": round(t2 - t1, 2),
                "train_with_calibration_s": round(t3 - t2, 2),
                "predict_ms": round((t4 - t3) / len(feats) * 1000, 3),
                "model_kb": round(size_kb, 1),
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
