"""A thin synchronous client of the REST API whose failures carry the API's error_code and error_msg."""
from collections.abc import Iterator
from typing import Any

import httpx

EXIT_USAGE = 2
EXIT_REFUSED = 65  # the API refused the request (4xx): EX_DATAERR
EXIT_UNAVAILABLE = 69  # the server could not be reached or failed (5xx): EX_UNAVAILABLE
EXIT_FORBIDDEN = 77  # no or wrong token, or no permission on the project: EX_NOPERM
EXIT_CONFIG = 78  # nothing says which server, token or project: EX_CONFIG


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


class Api:
    def __init__(self, *, url: str, token: str, timeout_s: float = 30) -> None:
        self.http = httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s,
                                 headers={"Authorization": f"Bearer {token}"})

    def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach {self.http.base_url}: {exc}", exit_code=EXIT_UNAVAILABLE) from None
        if response.status_code >= 400:
            raise failure(response)
        return response

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
