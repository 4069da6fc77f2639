"""A thin synchronous client of the REST API whose failures carry the API's error_code and error_msg.

The API may run as several replicas (docs/operations.md): `--url` / TRAINMASTER_URL then lists them, comma-separated.
A request goes to the replica that last answered; one that cannot be reached, or answers 503 (a service behind it
is changing leader), is passed over for the next, and when none answers the request is tried again for up to
HANDOVER_S. A request that may have reached a replica before its connection broke is tried again only if it
changes nothing (GET, HEAD): a job created twice would be worse than an error.
"""

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

EXIT_USAGE = 2
EXIT_REFUSED = 65  # the API refused the request (4xx): EX_DATAERR
EXIT_UNAVAILABLE = 69  # the server could not be reached or failed (5xx): EX_UNAVAILABLE
EXIT_FORBIDDEN = 77  # no or wrong token, or no permission on the project: EX_NOPERM
EXIT_CONFIG = 78  # nothing says which server, token or project: EX_CONFIG
HANDOVER_S = 30.0  # longer than a leader lease's hand-over (12 s) plus a service's start
RETRY_S = 0.5
SAFE = {"GET", "HEAD"}


class CliError(Exception):
    def __init__(self, message: str, *, exit_code: int, error_code: str = "") -> None:
        super().__init__(message)
        self.message, self.exit_code, self.error_code = message, exit_code, error_code


def failure(response: httpx.Response) -> CliError:
    try:
        body = response.json()
        code, message = str(body.get("error_code", "")), body.get("error_msg") or body.get("error_message") or ""
    except ValueError:
        code, message = "", response.text[:500]
    status = response.status_code
    exit_code = EXIT_FORBIDDEN if status in (401, 403) else EXIT_UNAVAILABLE if status >= 500 else EXIT_REFUSED
    return CliError(message or f"HTTP {status}", exit_code=exit_code, error_code=code or str(status))


def retry_after(response: httpx.Response) -> float:
    """The server's Retry-After in seconds (between RETRY_S and 5; a date or nonsense counts as RETRY_S)."""
    try:
        return min(5.0, max(RETRY_S, float(response.headers.get("retry-after", RETRY_S))))
    except ValueError:
        return RETRY_S


class Api:
    def __init__(
        self,
        *,
        url: str,
        token: str,
        timeout_s: float = 30,
        handover_s: float = HANDOVER_S,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
        if not urls:
            raise CliError("no API URL given", exit_code=EXIT_CONFIG)
        self.replicas = [
            httpx.Client(
                base_url=u, timeout=timeout_s, transport=transport, headers={"Authorization": f"Bearer {token}"}
            )
            for u in urls
        ]
        self.current, self.handover_s, self.sleep = 0, handover_s, sleep

    @property
    def http(self) -> httpx.Client:
        """The replica that last answered."""
        return self.replicas[self.current]

    def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        deadline = time.monotonic() + self.handover_s
        while True:
            response, wait = self._round(method, path, **kwargs)
            if response is not None and response.status_code != 503:
                break
            if time.monotonic() + wait > deadline:
                if response is None:
                    raise CliError(
                        f"cannot reach {', '.join(str(r.base_url) for r in self.replicas)}", exit_code=EXIT_UNAVAILABLE
                    )
                break
            self.sleep(wait)
        if response.status_code >= 400:
            raise failure(response)
        return response

    def _round(self, method: str, path: str, **kwargs: Any) -> tuple[httpx.Response | None, float]:
        """Each replica once, from the current one: the first answer that is not 503 (or the last 503), and how
        long to wait before another round."""
        response, wait = None, RETRY_S
        for _ in self.replicas:
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.HTTPError as exc:
                if method.upper() not in SAFE and not isinstance(exc, httpx.ConnectError):
                    raise CliError(
                        f"lost {self.http.base_url} during a {method} (it may have been applied: look "
                        f"before trying again): {exc}",
                        exit_code=EXIT_UNAVAILABLE,
                    ) from None
            else:
                if response.status_code != 503:
                    return response, 0.0
                wait = retry_after(response)
            self.current = (self.current + 1) % len(self.replicas)
        return response, wait

    def log_pages(self, path: str, **params: Any) -> Iterator[str]:
        """A stored log page by page (the API pages it by lines: X-Log-More, X-Log-Next-Offset)."""
        offset = 0
        while True:
            response = self.send("GET", path, params={**params, "offset": offset})
            yield response.text
            following = int(response.headers.get("x-log-next-offset", offset))
            if response.headers.get("x-log-more") != "true" or following <= offset:
                return
            offset = following

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.send(method, path, **kwargs)
        if response.status_code == 204:
            return None
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.text

    def stream(self, path: str, **params: Any) -> Iterator[str]:
        """Lines of a streamed text answer, as they come."""
        try:
            with self.http.stream("GET", path, params=params, timeout=httpx.Timeout(30, read=None)) as response:
                if response.status_code >= 400:
                    response.read()
                    raise failure(response)
                yield from response.iter_lines()
        except httpx.HTTPError as exc:
            raise CliError(f"lost {self.http.base_url}: {exc}", exit_code=EXIT_UNAVAILABLE) from None
