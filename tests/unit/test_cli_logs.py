"""`trainmaster logs` reads a long log page by page, as the API pages it."""

import httpx

from services.cli.client import Api

LINES = [f"line {i}\n" for i in range(25)]


def paged(request: httpx.Request) -> httpx.Response:
    offset, limit = int(request.url.params.get("offset", 0)), 10
    page = LINES[offset : offset + limit]
    more = offset + limit < len(LINES)
    return httpx.Response(
        200,
        text="".join(page),
        headers={
            "X-Log-Offset": str(offset),
            "X-Log-Next-Offset": str(offset + len(page)),
            "X-Log-More": "true" if more else "false",
        },
    )


def test_every_page_is_read_in_order():
    api = Api(url="http://api", token="t", transport=httpx.MockTransport(paged))
    assert "".join(api.log_pages("/v2/p/training-jobs/j/logs")) == "".join(LINES)


def test_a_server_that_does_not_advance_ends_the_loop():
    def stuck(request):
        return httpx.Response(200, text="x\n", headers={"X-Log-More": "true", "X-Log-Next-Offset": "0"})

    api = Api(url="http://api", token="t", transport=httpx.MockTransport(stuck))
    assert list(api.log_pages("/logs")) == ["x\n"]
