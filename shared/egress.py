"""Where the platform may connect for a user (webhooks, a job's http(s) code and inputs): public addresses only, or
hosts an operator allows; judged after DNS resolution, and again at every connection, to the address judged."""

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpcore
import httpx

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]

CGNAT = ipaddress.ip_network("100.64.0.0/10")  # not "private" to the ipaddress module before Python 3.12
RESOLVE_TIMEOUT_S = 5.0  # a request that names a slow DNS zone must not hold the API
NAT64 = ipaddress.ip_network("64:ff9b::/96")  # a gateway would carry these to the IPv4 address inside


class Refused(ValueError):
    """A URL or an address the platform will not connect to; the message says why, for the person who gave it."""


def why_blocked(address: Address) -> str | None:
    """Why an address is not public (None when it is); IPv6 forms that carry an IPv4 address are judged by it."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = (
            address.ipv4_mapped
            or address.sixtofour
            or (ipaddress.IPv4Address(int(address) & 0xFFFFFFFF) if address in NAT64 else None)
        )
        if embedded is not None:
            return why_blocked(embedded)
    checks = (
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("unspecified", address.is_unspecified),
        ("multicast", address.is_multicast),
        ("shared (CGNAT)", isinstance(address, ipaddress.IPv4Address) and address in CGNAT),
        ("reserved", address.is_reserved),
        ("private", address.is_private),
        ("not globally routable", not address.is_global),
    )
    return next((name for name, hit in checks if hit), None)


@dataclass(frozen=True)
class Policy:
    """Public addresses only, except the hosts (names or IPs) and networks the operator allows."""

    allow_hosts: frozenset[str] = frozenset()
    allow_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = field(default=())

    @classmethod
    def parse(cls, entries: Iterable[str]) -> "Policy":
        """From `host`, `1.2.3.4` or `10.0.0.0/8` entries (blank ones ignored)."""
        hosts, networks = set(), []
        for entry in (e.strip().lower().strip("[]") for e in entries):
            if not entry:
                continue
            if "/" in entry:
                networks.append(ipaddress.ip_network(entry, strict=False))
            else:
                hosts.add(entry)
        return cls(allow_hosts=frozenset(hosts), allow_networks=tuple(networks))

    def host_allowed(self, host: str) -> bool:
        return host.lower().strip("[]").rstrip(".") in self.allow_hosts

    def allows(self, host: str, address: Address | None = None) -> bool:
        """Whether the operator allows `host` by name, or `address` (the host's literal one where none is given) by
        one of its networks."""
        address = address if address is not None else literal(host)
        return self.host_allowed(host) or (
            address is not None and any(address in n for n in self.allow_networks if n.version == address.version)
        )

    def check_address(self, host: str, address: Address) -> None:
        """Raise Refused unless the address is public or allowed."""
        if self.allows(host, address):
            return
        reason = why_blocked(address)
        if reason and literal(host) == address:
            raise Refused(f"{host} is a {reason} address")
        if reason:  # not which address: a user would learn the platform's internal names and addresses from it
            raise Refused(f"{host} resolves to a {reason} address")


def literal(host: str) -> Address | None:
    """The address a host names literally (`::ffff:10.0.0.1` as well as `::ffff:a00:1`), None for a name."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


async def system_resolve(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for host (IP literals come back as they are)."""
    try:
        infos = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S
        )
    except TimeoutError:
        raise OSError(f"resolving {host} took more than {RESOLVE_TIMEOUT_S:g}s") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def checked_addresses(policy: Policy, host: str, port: int, *, resolve: Resolver = system_resolve) -> list[str]:
    """The host's addresses, each one allowed; Refused when one is not (a name must not mix in a private one)."""
    bare = host.strip("[]")
    if "%" in bare:  # fe80::1%eth0 picks the interface to leave by: what no public address needs
        raise Refused(f"{host}: zone ids (%) are not allowed in an address")
    try:
        addresses = await resolve(bare, port)
    except (OSError, UnicodeError) as exc:
        raise Refused(f"{host} does not resolve") from exc
    if not addresses:
        raise Refused(f"{host} does not resolve")
    for text in addresses:
        policy.check_address(host, ipaddress.ip_address(text.split("%", 1)[0]))
    return addresses


def is_http(url: str) -> bool:
    """Whether the URL is http(s), the schemes this policy judges (and fetches itself)."""
    return url.split("://", 1)[0].lower() in ("http", "https") and "://" in url


async def check_url(policy: Policy, url: str, *, resolve: Resolver = system_resolve) -> None:
    """Raise Refused unless url is http(s) to a host whose every address is public or allowed."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise Refused(f"not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise Refused("only http:// and https:// URLs are allowed")
    if not parts.hostname:
        raise Refused("the URL has no host")
    await checked_addresses(policy, parts.hostname, port, resolve=resolve)


async def refused_http(
    fields: Iterable[tuple[str, str]], policy: Policy, *, resolve: Resolver = system_resolve
) -> list[tuple[str, str]]:
    """(field, reason) for each http(s) URL of (field, url) pairs that the policy refuses; other schemes pass."""

    async def why(url: str) -> str | None:
        try:
            await check_url(policy, url, resolve=resolve)
        except Refused as exc:
            return str(exc)
        return None

    fields = [(name, url) for name, url in fields if is_http(url)]
    reasons = await asyncio.gather(*(why(url) for _, url in fields))
    return [(name, reason) for (name, _), reason in zip(fields, reasons) if reason]


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """Resolves and checks at every connection, then connects to an address it checked (no re-resolution)."""

    def __init__(self, policy: Policy, *, resolve: Resolver = system_resolve) -> None:
        self.policy, self.resolve, self.inner = policy, resolve, httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await checked_addresses(self.policy, host, port, resolve=self.resolve)
        except Refused as exc:
            raise httpcore.ConnectError(str(exc)) from None
        last: Exception | None = None
        for address in addresses:
            try:
                return await self.inner.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        raise last or httpcore.ConnectError("no address")

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not allowed")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def guarded_client(
    policy: Policy,
    *,
    timeout_s: float = 5,
    resolve: Resolver = system_resolve,
    max_redirects: int = 0,
    max_connections: int = 10,
) -> httpx.AsyncClient:
    """An HTTP client that reaches only what the policy allows: no proxy from the environment, no redirects unless
    `max_redirects` (each hop connects through the same check, so a redirect to a refused address fails); at most
    `max_connections` open at once (a request beyond waits for one, `timeout_s` at most)."""
    transport = httpx.AsyncHTTPTransport(retries=0)
    transport._pool = httpcore.AsyncConnectionPool(  # the documented pool, with our network backend
        ssl_context=httpx.create_ssl_context(),
        network_backend=GuardedBackend(policy, resolve=resolve),
        max_connections=max_connections,
    )
    return httpx.AsyncClient(
        transport=transport,
        timeout=timeout_s,
        trust_env=False,
        follow_redirects=max_redirects > 0,
        max_redirects=max_redirects,
    )
