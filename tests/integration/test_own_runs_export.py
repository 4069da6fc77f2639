"""The own-jobs export against the database server: what the estimator kept is written as the corpus reads it."""

import pytest

from shared.store import make_client
from services.estimator.app import EstimatorSettings
from services.estimator.model import owncorpus
from services.estimator.ownexport import export
from tests.factories import unique

pytestmark = pytest.mark.integration


async def test_kept_runs_are_exported_as_a_corpus_file(bus_and_database, tmp_path):
    database = unique("own").replace("-", "_")
    runs = [
        {
            "run": f"job-{i}",
            "group": "trainmaster",
            "params": {"seed": i},
            "points": [{"t": float(t), "step": float(t), "loss": 1.0 / t} for t in range(1, 30)],
        }
        for i in range(3)
    ]
    url = bus_and_database.mongo_url_of("estimator")
    client = make_client(url)
    try:
        await client[database].estimator_own_runs.insert_many([{"_id": r["run"], "run": r} for r in runs])
    finally:
        await client.close()
    out = tmp_path / "own-runs.jsonl.gz"
    assert await export(out, EstimatorSettings(mongo_url=url, mongo_db=database)) == 3
    assert sorted(owncorpus.load_sweep(out), key=lambda r: r["run"]) == runs
