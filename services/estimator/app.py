"""Estimator wiring: remaining-time estimates from each job's own metric curve."""

from pathlib import Path

from faststream import FastStream
from pydantic import Field

from shared.bus import read_up
from shared.origin import Origins
from shared.service import Wiring, service_app
from shared.settings import CommonSettings, own_mongo_db, own_mongo_url
from shared.store import DEFER_PULLS_S, REMEMBER_JOBS, DocumentStore, relay
from services.estimator.handlers import JOBS, PLACED, router
from services.estimator.modelstore import ModelStore, refresh_forever
from services.estimator.service import Estimator
from services.estimator.shipped import SHIPPED

SERVICE = "estimator"
REPO = Path(__file__).resolve().parents[2]


class EstimatorSettings(CommonSettings):
    mongo_url: str = own_mongo_url(SERVICE)
    mongo_db: str = own_mongo_db(SERVICE)
    model_dir: Path | None = Field(None, description="Versioned history models; default <data dir>/models.")
    mlperf_dir: Path = Field(
        REPO.parent / "shared" / "data" / "mlperf",
        description="MLPerf training-log tarballs the first history model is trained on.",
    )
    shipped_model: Path | None = Field(
        SHIPPED,
        description="The history model served until one is trained here (a path with no file: none; "
        "the first is then trained at start from the MLPerf logs).",
    )
    retrain_every: int = Field(20, ge=1, description="Completed jobs that trigger a new model version.")
    train_threads: int = Field(
        1,
        ge=1,
        le=64,
        description="CPU threads torch may use when training a history model "
        "(in a process of its own, at lower priority; the estimator itself never loads torch).",
    )


def create_app(settings: EstimatorSettings | None = None) -> FastStream:
    settings = settings or EstimatorSettings()

    async def setup(w: Wiring) -> Estimator:
        models = ModelStore(
            directory=settings.model_dir or settings.data_dir / "models",
            corpus=sorted(settings.mlperf_dir.glob("*.tar.gz")),
            shipped=settings.shipped_model,
            retrain_every=settings.retrain_every,
            threads=settings.train_threads,
        )
        # written by this service only: remembered, its published events pulled off later
        jobs = DocumentStore(w.db.estimator_jobs, w.broker, remember=REMEMBER_JOBS, defer_pulls_s=DEFER_PULLS_S)
        origins = Origins(placements=w.db.estimator_placements, all_read=lambda: read_up(w.broker, PLACED))
        telemetry = w.db.estimator_telemetry
        estimator = Estimator(
            broker=w.broker,
            jobs=jobs,
            points=w.db.estimator_points,
            history=w.db.estimator_history,
            own_runs=w.db.estimator_own_runs,
            models=models,
            origins=origins,
            telemetry=telemetry,
        )
        await estimator.points.create_index([("job_id", 1), ("t", 1)])
        await telemetry.create_index([("job_id", 1), ("t", 1)])
        await origins.prepare()
        estimator.warm_up()  # the served model loaded and asked once before the first question (refresh goes on)
        w.background.spawn("models", lambda: refresh_forever(models))
        w.background.spawn("outbox", lambda: relay(w.broker, [estimator.jobs.collection]))
        await JOBS.resume(w.broker)  # before any job event is read
        return estimator

    return service_app(name=SERVICE, settings=settings, router=router, setup=setup)
