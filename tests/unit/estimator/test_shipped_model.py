"""The history model shipped with trainmaster: served from a fresh install's first second (no training at start
taking a core beside the first jobs), superseded by one trained here, and always what the code beside it trains."""

import asyncio
import json
import shutil

import pytest

from services.estimator import modelstore, shipped
from services.estimator.app import EstimatorSettings
from services.estimator.model.history import HistoryPredictor
from services.estimator.modelstore import ModelStore, refresh_forever


@pytest.fixture(scope="module")
def closure() -> list[str]:
    """The training's sources as this tree has them, found once for the module: each look is a process that
    imports torch (about 3 s of CPU), and the tree does not change between this module's tests."""
    return shipped.training_sources()


@pytest.fixture
def sources_once(closure, monkeypatch):
    """`shipped.training_sources` answers the module's one look (`closure`), a fresh list each call."""
    monkeypatch.setattr(shipped, "training_sources", lambda: list(closure))


def test_the_shipped_model_is_what_this_code_trains_from_the_mlperf_logs(sources_once):
    """A change to the training's code, format or corpus without `make history-model` fails here."""
    HistoryPredictor.load(shipped.SHIPPED)  # of the format served now
    recorded = json.loads(shipped.PROVENANCE.read_text())
    tarballs = shipped.corpus_files(shipped.CORPUS)
    assert shipped.stale(recorded, tarballs or None) == []
    assert "services/estimator/model/history.py" in recorded["sources"]
    assert "services/estimator/train.py" in recorded["sources"]


def test_a_change_to_any_source_the_training_runs_makes_it_stale(monkeypatch, sources_once):
    recorded = json.loads(shipped.PROVENANCE.read_text())
    sources = shipped.training_sources()
    real = shipped.code_digest
    monkeypatch.setattr(shipped, "code_digest", lambda names: real(names[:-1]))  # as if one file had changed
    [reason] = shipped.stale(recorded, None)
    assert reason.startswith("code_sha256")
    assert shipped.stale({**recorded, "format_version": -1}, None)[0].startswith("format_version")
    assert sources == recorded["sources"]


@pytest.fixture
def spawned(monkeypatch):
    """The training processes a store starts (none is really run)."""
    seen = []
    real = asyncio.create_subprocess_exec

    async def spawn(*argv, **_):
        seen.append(argv)
        return await real("true")

    monkeypatch.setattr(modelstore.asyncio, "create_subprocess_exec", spawn)
    return seen


async def first_pass(store: ModelStore) -> None:
    """What the estimator does at start, then stop before its next look."""
    task = asyncio.create_task(refresh_forever(store, interval_s=60))
    await asyncio.sleep(0.2)
    task.cancel()


async def test_a_fresh_install_serves_the_shipped_model_and_trains_nothing_at_start(tmp_path, spawned):
    corpus = tmp_path / "corpus.tar.gz"
    corpus.write_bytes(b"")
    store = ModelStore(directory=tmp_path / "models", corpus=[corpus], shipped=shipped.SHIPPED)
    await first_pass(store)
    assert spawned == []
    assert store.version == 0 and store.predictor is not None
    assert store.status() == {"version": 0, "on_disk": [], "shipped": True, "training": False}
    assert EstimatorSettings.model_fields["shipped_model"].default == shipped.SHIPPED


async def test_a_model_trained_here_supersedes_the_shipped_one(tmp_path, spawned):
    store = ModelStore(directory=tmp_path / "models", corpus=[], shipped=shipped.SHIPPED)
    assert store.load_latest() and store.version == 0
    assert not store.load_latest()  # nothing new
    (tmp_path / "models").mkdir()
    shutil.copy(shipped.SHIPPED, tmp_path / "models" / "history-v1.npz")  # as the first retraining writes it
    assert store.load_latest() and store.version == 1 and store.status()["shipped"] is False


@pytest.mark.parametrize("kind", ["missing", "unreadable"])
async def test_without_a_servable_shipped_model_the_first_is_trained_at_start(tmp_path, spawned, kind):
    corpus = tmp_path / "corpus.tar.gz"
    corpus.write_bytes(b"")
    broken = tmp_path / "history-shipped.npz"
    if kind == "unreadable":
        broken.write_bytes(b"not a model")
    store = ModelStore(directory=tmp_path / "models", corpus=[corpus], shipped=broken)
    await first_pass(store)
    [argv] = spawned
    assert argv[argv.index("--out") + 1].endswith("history-v1.npz")
    assert store.version is None and store.predictor is None


def test_a_provenance_file_that_is_not_the_shipped_models_is_stale(tmp_path, monkeypatch, sources_once):
    recorded = json.loads(shipped.PROVENANCE.read_text())
    other = tmp_path / "history-shipped.npz"
    other.write_bytes(shipped.SHIPPED.read_bytes() + b"\0")  # another file than the one it describes
    monkeypatch.setattr(shipped, "SHIPPED", other)
    assert any(r.startswith("model_sha256") for r in shipped.stale(recorded, None))


async def test_after_an_upgrade_a_model_on_disk_of_an_older_format_is_passed_over_for_the_shipped_one(
    tmp_path, spawned, caplog
):
    models = tmp_path / "models"
    models.mkdir()
    (models / "history-v3.npz").write_bytes(b"a model of a format this code no longer reads")
    store = ModelStore(directory=models, corpus=[tmp_path / "corpus.tar.gz"], shipped=shipped.SHIPPED)
    await first_pass(store)
    assert spawned == [] and store.version == 0 and store.predictor is not None
    refusals = len([r for r in caplog.records if "not usable" in r.getMessage()])
    assert not store.load_latest() and refusals == 1  # refused once, not again at every look
    assert len([r for r in caplog.records if "not usable" in r.getMessage()]) == 1
    shutil.copy(shipped.SHIPPED, models / "history-v4.npz")  # the next retraining
    assert store.load_latest() and store.version == 4
