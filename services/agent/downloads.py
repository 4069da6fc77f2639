"""A job's http(s) code and inputs: fetched through the egress policy, never through fsspec.

DNS may have changed since the submitter checked the URL, so every connection (each redirect hop included)
resolves the host again, checks every address and connects to an address it checked (shared.egress); proxy
variables are ignored. What is written is counted against the task's caps (services.agent.sizecap).
"""

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from shared.egress import Policy, Resolver, guarded_client, system_resolve
from services.agent.sizecap import Tally

MAX_REDIRECTS = 5  # dataset hosts often send to a CDN; each hop is checked like the first
TIMEOUT_S = 60.0  # per connect and read, not the whole download
CHUNK = 1 << 20
FALLBACK_NAME = "download"


def file_name(url: str) -> str:
    """The file an URL's download is saved as: its last path segment, or FALLBACK_NAME when that is no safe name."""
    name = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
    if not name or name.startswith(".") or "/" in name or any(ord(c) < 32 for c in name) or len(name) > 255:
        return FALLBACK_NAME
    return name


@dataclass(frozen=True)
class Downloads:
    """Fetches http(s) URLs into a directory, reaching only what the policy allows."""

    policy: Policy = field(default_factory=Policy)
    resolve: Resolver = system_resolve

    async def fetch(self, url: str, target: Path, tally: Tally | None = None) -> int:
        """Save the URL's body as `target/<file_name(url)>` and return its size; raise (httpx.HTTPError, OSError)
        when it cannot, a refused address and a body past the tally's caps (TooLarge) included."""
        target.mkdir(parents=True, exist_ok=True)
        path = target / file_name(url)
        partial = path.with_name(path.name + ".partial")
        try:
            size = await self._save(url, partial, tally or Tally())
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        os.replace(partial, path)
        return size

    async def _save(self, url: str, path: Path, tally: Tally) -> int:
        size = 0
        async with guarded_client(
            self.policy, timeout_s=TIMEOUT_S, resolve=self.resolve, max_redirects=MAX_REDIRECTS
        ) as client:
            async with client.stream("GET", url, headers={"Accept-Encoding": "identity"}) as response:
                if response.status_code != 200:
                    raise OSError(f"HTTP {response.status_code}")
                if (announced := response.headers.get("content-length", "")).isdigit():
                    tally.expect(int(announced))  # refused early; what is written is still counted below
                with open(path, "wb") as out:
                    # The bytes as sent, never decoded: a server that compresses though asked not to (`gzip, gzip`
                    # stacked expands one read a hundred thousand times) is saved as it sent it, as curl saves it.
                    async for chunk in response.aiter_raw(CHUNK):
                        size += len(chunk)
                        tally.count(size, len(chunk))
                        out.write(chunk)
        return size
