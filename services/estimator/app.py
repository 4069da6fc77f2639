"""Estimator wiring: remaining-time estimates from each job's own metric curve."""
from contextlib import asynccontextmanager
from pathlib import Path

from faststream import FastStream
from pydantic import Field

from shared.bus import connect, make_broker
from shared.service import Background, add_health, configure_logging
from shared.settings import CommonSettings
from shared.store import make_client
from services.estimator.handlers import router
from services.estimator.models import ModelStore, refresh_forever
from services.estimator.service import Estimator

SERVICE = "estimator"
REPO = Path(__file__).resolve().parents[2]


class EstimatorSettings(CommonSettings):
    model_dir: Path | None = Field(None, description="Versioned history models; default <data dir>/models.")
    mlperf_dir: Path = Field(REPO.parent / "shared" / "data" / "mlperf",
                             description="MLPerf training-log tarballs the first history model is trained on.")
    retrain_every: int = Field(20, ge=1, description="Completed jobs that trigger a new model version.")


def create_app(settings: EstimatorSettings | None = None) -> FastStream:
    settings = settings or EstimatorSettings()
    configure_logging(settings.log_level)
    broker = make_broker(settings.nats_url, name=SERVICE)
    broker.include_router(router)
    add_health(broker, SERVICE)
    background = Background()

    @asynccontextmanager
    async def lifespan():
        await connect(broker)
        client = make_client(settings.mongo_url)
        db = client[settings.mongo_db]
        models = ModelStore(directory=settings.model_dir or settings.data_dir / "models",
                            corpus=sorted(settings.mlperf_dir.glob("*.tar.gz")), retrain_every=settings.retrain_every)
        estimator = Estimator(broker=broker, jobs=db.estimator_jobs, points=db.estimator_points,
                              history=db.estimator_history, models=models)
        await estimator.points.create_index([("job_id", 1), ("t", 1)])
        broker.context.set_global("estimator", estimator)
        yield
        await background.stop()
        await client.close()

    async def start_loops() -> None:
        estimator: Estimator = broker.context.get("estimator")
        background.spawn("models", lambda: refresh_forever(estimator.models))

    return FastStream(broker, lifespan=lifespan, after_startup=[start_loops])
