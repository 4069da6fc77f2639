"""Completed jobs' curves toward their declared targets, written as a file of the own-jobs corpus.

The estimator keeps each completed job that declared a target (`estimator_own_runs`, `JobModel.own_run`); this
writes them in the recorded corpus' shape, so the own-job band is refitted on them beside the recorded runs and
checked on the held-out seed (theirs included) before it replaces the shipped one:

    python -m services.estimator.ownexport --out own-runs.jsonl.gz  # MONGO_URL, else `make run`'s estimator database
    python -m bench.search.calibrate --sweep bench/search/data/*.jsonl.gz own-runs.jsonl.gz --out new.json
    trainmaster-eta-eval --corpus own-jobs --sweep bench/search/data/*.jsonl.gz own-runs.jsonl.gz --calibration new.json
"""

import argparse
import asyncio
import gzip
import json
from pathlib import Path

from shared.store import embedded_url, make_client
from services.estimator.app import SERVICE, EstimatorSettings


def corpus_line(doc: dict) -> str | None:
    """The stored run as a JSON line when it has the corpus' fields (a hand-edited or older document: None)."""
    run = doc.get("run")
    if isinstance(run, dict) and {"run", "group", "params", "points"} <= run.keys():
        return json.dumps(run, separators=(",", ":")) + "\n"
    return None


def database_url(settings: EstimatorSettings) -> str:
    """TRAINMASTER_ESTIMATOR_MONGO_URL or MONGO_URL when set, else the estimator's embedded database `make run`
    started in the data directory."""
    return settings.mongo_url if "mongo_url" in settings.model_fields_set else embedded_url(settings.data_dir, SERVICE)


async def export(out: Path, settings: EstimatorSettings) -> int:
    """Every kept run, written as it is read (a long history is never held in memory); returns how many."""
    client = make_client(database_url(settings))
    tmp, count = out.with_name(out.name + ".tmp"), 0
    try:
        with gzip.open(tmp, "wt") as handle:
            async for doc in client[settings.mongo_db].estimator_own_runs.find({}):
                if (line := corpus_line(doc)) is not None:
                    handle.write(line)
                    count += 1
    finally:
        await client.close()
    tmp.replace(out)
    return count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the file to write (gzipped JSON lines)")
    args = parser.parse_args(argv)
    count = asyncio.run(export(args.out, EstimatorSettings()))
    print(f"{args.out}: {count} completed jobs")


if __name__ == "__main__":
    main()
