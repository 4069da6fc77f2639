"""`GET /healthz` right after a start: a service that has not subscribed yet is asked again, not reported down."""

from dataclasses import dataclass, field
from types import SimpleNamespace

from nats.errors import NoRespondersError

from shared.bus import RPC_HEALTH, SERVICES
from tests.unit.api_app import client, make_app


@dataclass
class StartingBroker:
    """Each service's first `unheard` health questions find nobody listening (it is still subscribing); `down`
    never answers."""

    unheard: int = 1
    down: set[str] = field(default_factory=set)
    asked: list[str] = field(default_factory=list)

    async def request(self, payload, subject: str, timeout: float = 0):
        self.asked.append(subject)
        if any(subject == RPC_HEALTH.format(service=s) for s in self.down):
            raise NoRespondersError
        if self.asked.count(subject) <= self.unheard:
            raise NoRespondersError
        return SimpleNamespace(decode=lambda: _async({"replicas": 1}))

    async def ping(self, timeout: float = 0) -> bool:
        return True


async def _async(value):
    return value


async def health(broker: StartingBroker) -> tuple[int, dict]:
    app, _, _ = await make_app(broker=broker)

    async def ping() -> None:
        return None

    app.state.submitter.repo.ping = ping  # the in-memory collections have no server to ping
    async with client(app, token=None) as api:
        reply = await api.get("/healthz")
    return reply.status_code, reply.json()


async def test_a_service_still_subscribing_is_asked_again_and_reported_up():
    broker = StartingBroker(unheard=2)
    status, body = await health(broker)
    assert status == 200 and body["status"] == "ok", body
    assert all(broker.asked.count(RPC_HEALTH.format(service=s)) == 3 for s in SERVICES)


async def test_a_service_that_never_answers_is_still_reported_down_within_the_probe_time():
    broker = StartingBroker(unheard=0, down={SERVICES[0]})
    status, body = await health(broker)
    assert status == 503 and body["status"] == "degraded"
    assert body["services"][SERVICES[0]]["ok"] is False and "NoResponders" in body["services"][SERVICES[0]]["error"]
    assert all(body["services"][s]["ok"] for s in SERVICES[1:])
