"""A job's http(s) URL may name an IPv6 address in brackets: taken where the address policy takes the address (a
public one), refused as before for loopback, link-local, unique-local and IPv4-mapped private addresses, and for
zone ids and brackets that hold no IPv6 address; the `::` of a chained fsspec URL is still refused everywhere else."""

import pytest

from shared import egress
from shared.jobs import Algorithm
from shared.storage import StoragePolicy, refused_addresses, refused_urls
from tests.unit.addresses import resolver

POLICY = StoragePolicy(storage_root="s3://tm/storage", checkpoint_root="s3://tm/ckpt")
RESOLVE = resolver({})


async def submission(url: str, *, policy: StoragePolicy = POLICY) -> list[str]:
    """What the submitter says of an input at `url` (the pure checks, then the addresses), as reasons."""
    algorithm = Algorithm(command="true", inputs=[{"name": "data", "url": url}])
    refused = refused_urls(algorithm, policy=policy, project_id="vision") or await refused_addresses(
        algorithm, policy=policy, resolve=RESOLVE
    )
    assert all(field == "algorithm.inputs.0.url" for field, _ in refused)
    return [reason for _, reason in refused]


@pytest.mark.parametrize(
    "url",
    [
        "https://[2606:4700:4700::1111]/data.tar",
        "http://[2606:4700:4700::1111]:8080/data.tar",
        "HTTPS://[2001:4860:4860::8888]?v=1",
        "https://[2001:4860:4860::8888]#top",
        "http://reader@[2606:4700:4700::1111]/x",
        "http://[::ffff:8.8.8.8]/data.tar",
    ],
)
async def test_a_public_ipv6_literal_is_taken(url):
    assert await submission(url) == []


@pytest.mark.parametrize(
    "url, why",
    [
        ("http://[::1]:8000/healthz", "::1 is a loopback address"),
        ("http://[0:0:0:0:0:0:0:1]/", "0:0:0:0:0:0:0:1 is a loopback address"),
        ("http://[fe80::1]/", "fe80::1 is a link-local address"),
        ("http://[fd12:3456::1]/", "fd12:3456::1 is a private address"),
        ("http://[fc00::1]/", "fc00::1 is a private address"),
        ("http://[::ffff:10.0.0.1]/", "::ffff:10.0.0.1 is a private address"),
        ("http://[::ffff:169.254.169.254]/latest/meta-data/", "::ffff:169.254.169.254 is a link-local address"),
        ("http://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1 is a loopback address"),
        ("http://[fe80::1%25eth0]/", "zone ids (%) are not allowed in an IPv6 address"),
        ("http://[fe80::1%eth0]/", "zone ids (%) are not allowed in an IPv6 address"),
        ("http://[2606:4700:4700::1111%25eth0]/", "zone ids (%) are not allowed in an IPv6 address"),
        ("http://[1.2.3.4]/", "'1.2.3.4' is not an IPv6 address"),
        ("http://[v1.fe80::1]/", "is not an IPv6 address"),
        ("http://[2606:4700:4700::1111]x/", "not a valid IPv6 address in brackets"),
        ("http://[2606:4700:4700::1111/", "not a valid IPv6 address in brackets"),
        ("http://[2606:4700:4700::1111]/a::b", "chained URLs (::) are not allowed"),
        ("http://[2606:4700:4700::1111]:80::s3://x/", "not a valid IPv6 address in brackets"),
        ("s3://[::1]/bucket", "chained URLs (::) are not allowed"),
        ("simplecache::https://[2606:4700:4700::1111]/x", "chained URLs (::) are not allowed"),
    ],
)
async def test_what_is_not_public_or_not_an_address_is_still_refused(url, why):
    [reason] = await submission(url)
    assert why in reason


async def test_an_operator_allowed_network_admits_its_ipv6_literals_but_never_with_a_zone():
    allowing = StoragePolicy(storage_root="s3://tm/s", checkpoint_root="s3://tm/c", allow_hosts=("fd12:3456::/32",))
    assert await submission("http://[fd12:3456::1]/x", policy=allowing) == []
    policy = egress.Policy.parse(["fe80::/10"])  # the agent's check at fetch time, which sees every URL again
    await egress.check_url(policy, "http://[fe80::1]/", resolve=RESOLVE)
    with pytest.raises(egress.Refused, match="zone ids"):
        await egress.check_url(policy, "http://[fe80::1%eth0]/", resolve=RESOLVE)
