"""The estimator's warm-up at start: the newest model served and asked once before the first question, so placement's
first estimate after a start finds a model (the background refresh used to load it a moment after the service
listened) and its first prediction pays nothing first."""

from shared.rpc import PredictQuery
from shared.store import DocumentStore
from services.estimator import shipped
from services.estimator.modelstore import ModelStore
from services.estimator.service import Estimator
from tests.memory import MemoryCollection


class NoBus:
    async def publish(self, *args, **kwargs):
        raise AssertionError("the warm-up published")


def test_the_first_question_after_the_warm_up_is_answered_by_the_served_model(tmp_path):
    models = ModelStore(directory=tmp_path / "models", corpus=[], shipped=shipped.SHIPPED)
    bus = NoBus()
    estimator = Estimator(
        broker=bus,
        jobs=DocumentStore(MemoryCollection("jobs"), bus),
        points=MemoryCollection("points"),
        history=MemoryCollection("history"),
        own_runs=MemoryCollection("own_runs"),
        models=models,
    )
    warm = estimator.warm_up()
    assert warm.model_version == 0 and warm.duration_s and warm.duration_s > 0
    first = estimator.predict(PredictQuery(benchmark="resnet", batch_size=32))
    assert first.model_version == 0 and first.duration_s is not None
    assert models.training is None  # nothing trained by the warm-up
