"""Schemathesis over the running submitter's OpenAPI, with real job ids seeded so the per-job routes are reached:
no generated request, valid or not, gets a server error, and 2xx answers match the schema."""

import random
import time

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings, strategies as st
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.factories import job_body, unique

pytestmark = pytest.mark.e2e

EXAMPLES = 8  # per operation and mode: ~25 operations x 2 modes
BUDGET_S = 75  # generation stops early past it, whatever is left
TIMEOUT_S = 10


def seed(api: httpx.Client, project: str) -> dict[str, list[str]]:
    """A throwaway user, and jobs in several phases: finished, running, and one that waits behind the runner."""
    user = api.post("/v2/users", json={"user_name": unique("fuzz"), "projects": [project]})
    assert user.status_code in (200, 201), user.text
    ids = []
    for command, extra in (("echo done", {}), ("exit 3", {}), ("sleep 120", {"allowed": "local"})):
        answer = api.post(f"/v2/{project}/training-jobs", json=job_body(command=command, **extra))
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["metadata"]["id"])
    return {"job_id": ids, "user_name": [user.json()["user_name"]], "project_id": [project]}


def strategy(operation, seeded: dict[str, list[str]]):
    """Valid and invalid cases; half of them aimed at the seeded project, jobs and user."""
    names = [p.name for p in operation.path_parameters]
    options = []
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        options.append(operation.as_strategy(generation_mode=mode))
        if names:
            aimed = st.fixed_dictionaries({n: st.sampled_from(seeded.get(n, ["x"])) for n in names})
            options.append(
                aimed.flatmap(lambda path, mode=mode: operation.as_strategy(generation_mode=mode, path_parameters=path))
            )
    return st.one_of(options)


def test_no_server_errors_over_the_openapi(stack, admin_headers):
    project = f"fuzz-{random.randrange(10**6)}"
    with httpx.Client(base_url=stack.api_url, headers=admin_headers, timeout=30) as api:
        seeded = seed(api, project)
    running = seeded["job_id"][-1]
    schema = schemathesis.openapi.from_url(f"{stack.api_url}/openapi.json")
    deadline = time.monotonic() + BUDGET_S
    errors, mismatches, calls = [], [], []

    for result in schema.get_all_operations():
        operation = result.ok()

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy(operation, seeded))
        def fuzz(case):
            if time.monotonic() > deadline:
                return
            if case.path.endswith("/logs") and case.path_parameters.get("job_id") == running:
                case.query = {**(case.query or {}), "follow": "false"}  # following it would last as long as it runs
            try:
                response = case.call(headers=admin_headers, timeout=TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 (a dropped connection is as bad as a 500)
                errors.append(f"{case.method} {case.formatted_path}: {exc!r}")
                return
            calls.append(response.status_code)
            if response.status_code >= 500:
                errors.append(
                    f"{case.method} {case.formatted_path} {case.query} {case.body!r:.300} -> "
                    f"{response.status_code} {response.text[:300]}"
                )
            elif response.status_code < 300:
                try:
                    case.validate_response(response, checks=[response_schema_conformance])
                except Exception as exc:  # noqa: BLE001
                    mismatches.append(f"{case.method} {case.formatted_path} -> {exc}"[:500])

        fuzz()

    assert len(calls) > 100, f"only {len(calls)} requests were made"
    assert sum(1 for s in calls if s < 300) > 20, "hardly any request was accepted: the seeding did not work"
    assert not errors, "\n".join(errors[:20])
    assert not mismatches, "\n".join(mismatches[:20])
