"""The CLI with several API replicas: an unreachable one or a 503 is passed over, a hand-over waited out, and a
request that may have been applied is never sent twice."""

import httpx
import pytest

from services.cli.client import EXIT_UNAVAILABLE, Api, CliError

A, B = "http://a.test", "http://b.test"


class Fleet:
    """Replicas by host: each answers from its own list of outcomes (a status, or an exception to raise)."""

    def __init__(self, **outcomes: list) -> None:
        self.outcomes, self.seen = outcomes, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host.split(".")[0]
        self.seen.append((request.method, host))
        outcome = self.outcomes[host].pop(0) if len(self.outcomes[host]) > 1 else self.outcomes[host][0]
        if isinstance(outcome, Exception):
            raise outcome
        return httpx.Response(
            outcome,
            json={"ok": outcome}
            if outcome < 400
            else {"error_code": "406003", "error_msg": "billing service did not answer"},
            headers={"Retry-After": "1"},
        )


def api(fleet: Fleet, **kwargs) -> tuple[Api, list[float]]:
    waits: list[float] = []
    return Api(url=f"{A}, {B}", token="t", transport=httpx.MockTransport(fleet), sleep=waits.append, **kwargs), waits


def test_an_unreachable_replica_is_passed_over_and_the_next_request_starts_where_the_last_answered():
    fleet = Fleet(a=[httpx.ConnectError("refused")], b=[200])
    client, waits = api(fleet)
    assert client.call("POST", "/v2/p/training-jobs", json={}) == {"ok": 200}
    assert client.call("GET", "/v2/p/training-jobs") == {"ok": 200}
    assert fleet.seen == [("POST", "a"), ("POST", "b"), ("GET", "b")] and waits == []


def test_a_hand_over_is_waited_out_as_the_server_asks():
    fleet = Fleet(a=[503, 503, 201], b=[503, 503, 201])
    client, waits = api(fleet)
    assert client.call("POST", "/v2/p/training-jobs", json={}) == {"ok": 201}
    assert waits == [1.0, 1.0]  # Retry-After: 1, after each round of both replicas


def test_a_request_that_may_have_been_applied_is_not_sent_again():
    fleet = Fleet(a=[httpx.ReadTimeout("slow")], b=[201])
    client, _ = api(fleet)
    with pytest.raises(CliError, match="may have been applied") as failed:
        client.call("POST", "/v2/p/training-jobs", json={})
    assert failed.value.exit_code == EXIT_UNAVAILABLE and fleet.seen == [("POST", "a")]
    assert client.call("GET", "/v2/p/training-jobs") == {"ok": 201}  # a read is safe on the other one


def test_past_the_hand_over_time_the_last_answer_or_the_outage_is_reported():
    client, waits = api(Fleet(a=[503], b=[503]), handover_s=0.0)
    with pytest.raises(CliError, match="billing service did not answer") as failed:
        client.call("GET", "/v2/p/training-jobs")
    assert failed.value.exit_code == EXIT_UNAVAILABLE and waits == []
    client, _ = api(Fleet(a=[httpx.ConnectError("x")], b=[httpx.ConnectError("y")]), handover_s=0.0)
    with pytest.raises(CliError, match="cannot reach http://a.test, http://b.test"):
        client.call("GET", "/v2/p/training-jobs")
