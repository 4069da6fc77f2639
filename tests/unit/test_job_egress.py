"""A job's http(s) URLs (code, inputs) under the webhooks' address policy: every address form that is not public is
refused, named by its field, unless the operator allows the host or its network."""

import pytest

from shared.jobs import Algorithm
from shared.storage import StoragePolicy, refused_addresses
from tests.unit.addresses import NOT_PUBLIC, PUBLIC, in_url, resolver

POLICY = StoragePolicy(storage_root="s3://tm/storage", checkpoint_root="s3://tm/ckpt")
RESOLVE = resolver(
    {
        "rebind.example.test": ["127.0.0.1"],
        "mixed.example.test": ["93.184.216.34", "10.0.0.7"],
        "localhost": ["127.0.0.1", "::1"],
        "svc.internal": ["10.20.1.1"],
    }
)


async def refused(url: str, *, policy: StoragePolicy = POLICY, field: str = "inputs") -> list[tuple[str, str]]:
    algorithm = (
        Algorithm(command="true", code_dir=url)
        if field == "code_dir"
        else Algorithm(command="true", inputs=[{"name": "data", "url": url}])
    )
    return await refused_addresses(algorithm, policy=policy, resolve=RESOLVE)


@pytest.mark.parametrize("address", NOT_PUBLIC)
async def test_every_address_that_is_not_public_is_refused_for_inputs_and_code(address):
    for field in ("inputs", "code_dir"):
        [(name, reason)] = await refused(f"http://{in_url(address)}:8080/data.tar", field=field)
        assert name == ("algorithm.inputs.0.url" if field == "inputs" else "algorithm.code_dir")
        assert "address" in reason


@pytest.mark.parametrize("address", PUBLIC)
async def test_public_addresses_pass(address):
    assert await refused(f"https://{in_url(address)}/data.tar") == []


@pytest.mark.parametrize(
    "url, why",
    [
        ("http://127.0.0.1:8000/healthz", "127.0.0.1 is a loopback address"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("HTTP://[::ffff:169.254.169.254]/", "link-local"),
        ("https://rebind.example.test/x", "resolves to a loopback address"),
        ("https://mixed.example.test/x", "resolves to a private address"),
        ("https://nowhere.example.test/x", "does not resolve"),
        ("http:///x", "no host"),
    ],
)
async def test_refusals_say_why(url, why):
    [(_, reason)] = await refused(url)
    assert why in reason


async def test_a_name_that_resolves_to_the_loopback_through_the_system_resolver_is_refused():
    algorithm = Algorithm(command="true", inputs=[{"name": "data", "url": "http://localhost:8000/healthz"}])
    [(_, reason)] = await refused_addresses(algorithm, policy=POLICY)
    assert "localhost resolves to" in reason and "loopback" in reason


async def test_other_schemes_are_the_allow_lists_not_this_policys():
    for url in ("s3://tm/storage/vision/x", "file:///data/x", "/data/x"):
        assert await refused(url) == []


async def test_the_operator_allows_hosts_and_networks_explicitly():
    policy = POLICY.model_copy(update={"allow_hosts": ("127.0.0.1", "10.20.0.0/16")})
    assert await refused("http://127.0.0.1:8000/x", policy=policy) == []
    assert await refused("http://svc.internal/x", policy=policy) == []
    for url in ("http://127.0.0.2/x", "http://localhost/x", "http://169.254.169.254/", "http://rebind.example.test/"):
        assert await refused(url, policy=policy), url
