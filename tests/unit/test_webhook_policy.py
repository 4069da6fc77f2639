"""Webhook targets: only public addresses, judged after resolution, unless an operator allows the host."""

import ipaddress

import pytest

from shared.egress import Policy, Refused, check_url, why_blocked
from tests.unit.addresses import NOT_PUBLIC, PUBLIC, resolver


@pytest.mark.parametrize("address", NOT_PUBLIC)
def test_addresses_that_are_not_public_are_named(address):
    assert why_blocked(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_pass(address):
    assert why_blocked(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    "url, why",
    [
        ("http://127.0.0.1:8080/hook", "loopback"),
        ("http://[::1]/hook", "loopback"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("https://10.1.2.3/x", "private"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://100.64.1.2/", "CGNAT"),
        ("http://rebind.example.test/hook", "resolves to a loopback address"),
        ("http://mixed.example.test/hook", "resolves to a private address"),
        ("http://nowhere.example.test/", "does not resolve"),
        ("ftp://93.184.216.34/", "http"),
        ("file:///etc/passwd", "http"),
        ("http:///path", "no host"),
    ],
)
async def test_refused_urls_say_why(url, why):
    resolve = resolver({"rebind.example.test": ["127.0.0.1"], "mixed.example.test": ["93.184.216.34", "10.0.0.7"]})
    with pytest.raises(Refused, match=why):
        await check_url(Policy(), url, resolve=resolve)


async def test_localhost_is_refused_through_the_system_resolver():
    with pytest.raises(Refused, match="localhost resolves to .*loopback"):
        await check_url(Policy(), "http://localhost:9/hook")


async def test_a_public_host_passes():
    resolve = resolver({"hooks.example.com": ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"]})
    await check_url(Policy(), "https://hooks.example.com/trainmaster?key=1", resolve=resolve)


async def test_the_allow_list_admits_named_hosts_and_networks_only():
    policy = Policy.parse(["127.0.0.1", " Relay.Internal ", "10.20.0.0/16", ""])
    resolve = resolver({"relay.internal": ["10.9.9.9"], "svc.internal": ["10.20.1.1"], "other.internal": ["10.21.0.1"]})
    await check_url(policy, "http://127.0.0.1:5000/hook", resolve=resolve)
    await check_url(policy, "http://relay.internal/hook", resolve=resolve)  # allowed by name, whatever it resolves to
    await check_url(policy, "http://svc.internal/hook", resolve=resolve)  # resolves inside an allowed network
    for url in ("http://other.internal/", "http://127.0.0.2/", "http://[::1]/", "http://169.254.169.254/"):
        with pytest.raises(Refused):
            await check_url(policy, url, resolve=resolve)
