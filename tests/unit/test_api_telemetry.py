"""The API configures no OpenTelemetry, so a request costs no look-up of the global providers (FastAPI's native
telemetry would look them up, through environment reads, on every request)."""

from opentelemetry import _logs, metrics, trace

from tests.unit.api_app import client, make_app


async def test_a_request_looks_up_no_telemetry_provider(monkeypatch):
    app, _, _ = await make_app()
    looked: list[str] = []
    for module, name in (
        (trace, "get_tracer_provider"),
        (metrics, "get_meter_provider"),
        (_logs, "get_logger_provider"),
    ):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda original=original, name=name: looked.append(name) or original())
    async with client(app) as api:
        answer = await api.get("/v2/p1/training-jobs")
    assert answer.status_code == 200
    assert looked == []
