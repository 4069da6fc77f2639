"""The portal in headless Chromium: sign in, submit, watch the curve and ETA, terminate, nodes and costs pages."""

import os
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN
from tests.factories import unique

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
TRAIN = """python3 -c "import math, time
for step in range(1, 601):
    print(f'step {step} loss {2.0 - 0.003 * step + 0.03 * math.sin(step):.4f}', flush=True)
    time.sleep(0.1)"
"""


@pytest.fixture
def shots(tmp_path) -> Path:
    folder = Path(os.environ.get("TRAINMASTER_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nportal screenshots in {folder}")
    return folder


@pytest.fixture(scope="module")
def browser():
    """One Chromium for the module (its start took seconds a test); each test gets a context of its own."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(stack, browser):
    """A page in a fresh browser context: no cookie, storage or cache of an earlier test."""
    context = browser.new_context(viewport={"width": 1440, "height": 1000}, device_scale_factor=1)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: "Content Security Policy" in m.text and errors.append(m.text))  # a blocked script
    page.on("dialog", lambda dialog: dialog.accept())
    page.set_default_timeout(30_000)
    yield page
    context.close()
    assert not errors, f"JavaScript errors in the portal: {errors}"


def wait_for(check, *, timeout_s: float = 45, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"{what} not reached after {timeout_s}s")


def test_a_researcher_submits_watches_and_terminates_a_job(stack, page, project, shots):
    response = page.goto(f"{stack.api_url}/ui/")
    policy = response.headers["content-security-policy"]
    assert "script-src 'self';" in policy and "frame-ancestors 'none'" in policy  # and the portal runs under it
    page.wait_for_selector("#login-form")
    page.screenshot(path=shots / "01-login.png")
    page.fill("#login-token", "not-a-token")
    page.click("#login-form button[type=submit]")
    page.wait_for_selector("#login-error:not(.hidden)")
    page.fill("#login-token", ADMIN_TOKEN)
    page.check("#login-remember")  # "stay signed in": the only way a token reaches localStorage
    page.click("#login-form button[type=submit]")
    page.wait_for_selector("#shell:not(.hidden)")
    assert page.evaluate("localStorage.getItem('trainmaster.token')") == ADMIN_TOKEN

    page.fill("#project", project)
    page.dispatch_event("#project", "change")
    page.wait_for_selector("#jobs-table")

    page.click("a[data-nav=submit]")
    name = unique("portal")
    page.fill("#submit-form [name=name]", name)
    page.fill("#submit-form [name=description]", "learning-rate sweep, first try")
    page.fill("#submit-form [name=command]", TRAIN)
    page.fill("#submit-form [name=metric_target]", "0.3")
    page.fill("#submit-form [name=expected_duration_s]", "40")
    page.fill("#submit-form [name=parameters]", "lr=0.1\nbatch_size=64")
    page.fill("#submit-form [name=secrets]", "WANDB_API_KEY=portal-secret-4f2a")
    page.select_option("#submit-form [name=allowed]", "local")
    page.screenshot(path=shots / "02-submit.png", full_page=True)
    page.click("#submit-button")
    page.wait_for_url("**/ui/#/job/*")
    job_id = page.url.rsplit("/", 1)[1]
    shown = httpx.get(f"{stack.api_url}/v2/{project}/training-jobs/{job_id}", headers=AUTH, timeout=10).text
    assert '"secret_names":["WANDB_API_KEY"]' in shown and "portal-secret-4f2a" not in shown  # sent, never shown

    page.wait_for_selector("#job-phase [data-phase=Running]", timeout=60_000)
    wait_for(
        lambda: (page.evaluate("TM.charts.metric && TM.charts.metric.data.datasets[0].data.length") or 0) > 20,
        what="the metric curve",
    )
    wait_for(lambda: page.get_attribute("#metric-chart", "data-band") == "drawn", what="the ETA band")
    wait_for(lambda: page.evaluate("TM.charts.metric.data.datasets[0].data.length") > 40, what="a longer curve")
    assert page.evaluate("TM.charts.metric.data.datasets[1].data[0].y") == 0.3  # the target line
    # the GPU chart beside the curve: no NVML in the test stack, so it says why it is empty
    assert page.inner_text("#gpu-note") in ("no GPUs", "no GPU readings yet")
    assert page.inner_text("#eta-text") not in ("", "–")
    wide = "{remaining_s: 120, low_s: 60, high_s: 360, finish_time: '2026-01-01T12:00:00Z'}"
    assert page.evaluate(f"TM.etaText({wide}).main") == "about 2 min"  # a wide band is a rough time, not a clock
    finish = page.evaluate(f"TM.finishText({wide})")
    assert finish["main"].startswith("around ") and finish["main"].count(":") == 1  # to the minute
    assert finish["band"].startswith("between ") and finish["band"].count(":") == 2
    narrow = "{remaining_s: 120, low_s: 110, high_s: 130, finish_time: '2026-01-01T12:00:00Z'}"
    assert page.evaluate(f"TM.finishText({narrow}).main").count(":") == 2  # to the second
    printed = "{done: 300, total: 1000, unit: 'it', rate: 30.1, source: 'tqdm', until: 'end', target: null}"
    assert page.evaluate(f"TM.workText({printed})") == "300/1,000 it · 30.1 it/s · from its tqdm bar"
    assert page.evaluate("TM.etaLabel({until: 'end', target: 'reached'})") == "Target reached · time to the end"
    assert page.evaluate("TM.etaLabel({until: 'end', target: 'unreachable'})").startswith("Target unreachable")
    assert page.text_content("#eta-label") in ("Time to target", "Target reached", "Target reached · time to the end")
    assert "step" in page.inner_text("#logs")
    assert page.inner_text(".tl-row").startswith("#1")
    page.screenshot(path=shots / "03-job-running.png", full_page=True)

    page.click("a[data-nav=jobs]")
    row = page.wait_for_selector(f"tr[data-job='{job_id}']")
    wait_for(lambda: "%" in row.inner_text() and "local" in row.inner_text(), what="progress and node kind in the list")
    page.screenshot(path=shots / "04-jobs.png", full_page=True)
    page.click("#phase-chips .chip[data-phase=Running]")
    page.wait_for_selector(f"tr[data-job='{job_id}']")

    page.click("a[data-nav=nodes]")
    page.wait_for_selector("tr[data-node='ondemand-1']")
    assert page.locator("#nodes-table tbody tr").count() == 4
    assert "A100-80GB" in page.inner_text("#nodes-table") and "on-demand" in page.inner_text("#nodes-table")
    wait_for(lambda: job_id[:8] in page.inner_text("#nodes-table"), what="the running job on its node")
    page.screenshot(path=shots / "05-nodes.png", full_page=True)

    page.click("a[data-nav=jobs]")
    page.click(f"tr[data-job='{job_id}'] a")
    page.wait_for_selector("#job-phase [data-phase=Running]")
    page.click("#btn-terminate")
    page.wait_for_selector("#job-phase [data-phase=Terminated]", timeout=60_000)
    assert page.is_disabled("#btn-terminate")
    page.screenshot(path=shots / "06-job-terminated.png", full_page=True)

    page.click("a[data-nav=costs]")
    wait_for(
        lambda: page.evaluate("TM.charts.byUser && TM.charts.byUser.data.labels.includes('admin')"),
        what="the cost by user chart",
    )
    wait_for(
        lambda: page.evaluate("TM.charts.byKind && TM.charts.byKind.data.labels.includes('local')"),
        what="the cost by node kind chart",
    )
    page.wait_for_timeout(300)
    page.screenshot(path=shots / "07-costs.png", full_page=True)

    page.click("#logout")
    page.wait_for_selector("#login:not(.hidden)")
    assert page.evaluate("localStorage.getItem('trainmaster.token')") is None


def test_a_user_lands_in_their_own_project(stack, page, shots):
    import httpx

    user, project = unique("ana"), unique("vision")
    issued = httpx.post(
        f"{stack.api_url}/v2/users",
        json={"user_name": user, "projects": [project]},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=10,
    )
    assert issued.status_code == 201, issued.text
    page.goto(f"{stack.api_url}/ui/#/jobs")
    page.evaluate("localStorage.clear(); sessionStorage.clear()")
    page.reload()
    page.fill("#login-token", issued.json()["token"])
    assert not page.is_checked("#login-remember")  # by default a token lives as long as the tab
    page.click("#login-form button[type=submit]")
    page.wait_for_selector("#jobs-table")
    assert page.input_value("#project") == project
    assert user in page.inner_text("#who")
    assert page.evaluate("localStorage.getItem('trainmaster.token')") is None  # this session only
    assert page.evaluate("sessionStorage.getItem('trainmaster.token')") == issued.json()["token"]
    page.wait_for_selector("#jobs-table td.empty:has-text('No jobs')")
    page.screenshot(path=shots / "08-user-empty-project.png")


def test_the_api_reference_renders_offline_under_its_policy(stack, page):
    """Swagger UI and ReDoc from the API's own files: rendered, with no CSP refusal (the fixture fails on one)."""
    outside: list[str] = []
    page.on(
        "request",
        lambda r: (
            not r.url.startswith(stack.api_url) and not r.url.startswith(("data:", "blob:")) and outside.append(r.url)
        ),
    )
    page.goto(f"{stack.api_url}/docs")
    page.wait_for_selector(".swagger-ui .info .title:has-text('trainmaster')")
    page.wait_for_selector(".opblock-tag-section")
    page.goto(f"{stack.api_url}/redoc")
    page.wait_for_selector("h1:has-text('trainmaster')")
    assert outside == [], outside


def test_a_link_opens_its_job_after_sign_in_with_cost_gpu_and_the_whole_curve(stack, page, project, shots):
    import httpx

    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    steps = 2400  # more points than the API returns: the curve must be thinned, not cut to its last ones
    body = {
        "metadata": {"name": unique("linked")},
        "algorithm": {
            "command": f"python3 -c \"import time; [print(f'step {{s}} loss {{25 / (s + 1):.5f}}', flush=True) or "
            f'time.sleep(0.002) for s in range({steps})]"',
            "metrics": [{"name": "loss", "regex": r"loss (?P<value>[0-9.]+)", "mode": "min"}],
        },
        "spec": {"resource": {"gpu_count": 1}, "placement": {"allowed": "local"}},
    }
    created = httpx.post(f"{stack.api_url}/v2/{project}/training-jobs", json=body, headers=admin, timeout=30)
    assert created.status_code == 201, created.text
    job_id = created.json()["metadata"]["id"]
    wait_for(
        lambda: (
            httpx.get(f"{stack.api_url}/v2/{project}/training-jobs/{job_id}", headers=admin, timeout=10).json()[
                "status"
            ]["phase"]
            == "Completed"
        ),
        what="the job's end",
    )
    users = [unique("ana") for _ in range(2)]
    for user in users:
        answer = httpx.post(
            f"{stack.api_url}/v2/users",
            json={"user_name": user, "projects": [user + "-proj"]},
            headers=admin,
            timeout=10,
        )
        assert answer.status_code == 201, answer.text

    page.goto(f"{stack.api_url}/ui/")
    page.evaluate("localStorage.clear(); sessionStorage.clear()")
    page.goto(f"{stack.api_url}/ui/#/job/{job_id}?project={project}")  # a link someone sent
    page.wait_for_selector("#login-form")
    page.fill("#login-token", ADMIN_TOKEN)
    page.click("#login-form button[type=submit]")
    page.wait_for_selector(f"#job-name:has-text('{body['metadata']['name']}')")
    assert page.input_value("#project") == project
    wait_for(lambda: page.inner_text("#job-cost").startswith("$"), what="the cost so far")
    node = page.inner_text("#job-facts dd")
    assert "RTX" in node and "/h" in node, node  # the GPU model and the node's price
    wait_for(lambda: "priority" in page.inner_text("#job-why"), what="why placement chose the node")
    last = round(25 / steps, 5)  # the estimator reads the output as it comes: the last point may come late
    curve = wait_for(
        lambda: page.evaluate(
            "TM.charts.metric && TM.charts.metric.data.datasets[0].data.length "
            f"&& TM.charts.metric.data.datasets[0].data.at(-1).y === {last} "
            "&& TM.charts.metric.data.datasets[0].data"
        ),
        what="the whole curve",
        timeout_s=90,
    )
    values = [p["y"] for p in curve]
    assert len(values) <= 2000 and values[0] == 25.0, values[:3]  # thinned, from the first point on
    assert page.get_attribute("#job-link", "href").endswith(f"#/job/{job_id}?project={project}")
    page.screenshot(path=shots / "09-linked-job.png", full_page=True)

    page.evaluate("localStorage.removeItem('trainmaster.project')")  # the admin, no project chosen yet
    page.goto(f"{stack.api_url}/ui/#/jobs")
    page.reload()
    links = page.wait_for_selector(".project-links")
    assert all(f"{user}-proj" in links.inner_text() for user in users)
    page.click(f".project-links a[data-project='{users[0]}-proj']")
    page.wait_for_selector("#jobs-table")
    assert page.input_value("#project") == f"{users[0]}-proj"


def test_a_search_chart_is_on_a_log_scale_when_a_first_loss_dwarfs_the_rest(stack, page, project):
    import httpx

    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    command = "python3 -c \"[print(f'step {s} loss {25 if s == 0 else 0.5 / s:.4f}') for s in range(40)]\""
    body = {
        "max_trials": 2,
        "parallelism": 2,
        "objective": {"metric": "loss", "mode": "min"},
        "space": {"lr": {"type": "float", "low": 0.01, "high": 0.1}},
        "template": {
            "algorithm": {
                "command": command,
                "metrics": [{"name": "loss", "regex": r"step (?P<step>\d+) loss (?P<value>[0-9.]+)", "mode": "min"}],
            },
            "spec": {"placement": {"allowed": "local"}},
        },
    }
    created = httpx.post(f"{stack.api_url}/v2/{project}/searches", json=body, headers=admin, timeout=30)
    assert created.status_code == 201, created.text
    search_id = created.json()["metadata"]["id"]
    wait_for(
        lambda: (
            httpx.get(f"{stack.api_url}/v2/{project}/searches/{search_id}", headers=admin, timeout=10).json()["status"][
                "phase"
            ]
            != "Running"
        ),
        what="the search's end",
    )
    page.goto(f"{stack.api_url}/ui/")
    page.evaluate(f"localStorage.setItem('trainmaster.token', '{ADMIN_TOKEN}')")
    page.goto(f"{stack.api_url}/ui/#/search/{search_id}?project={project}")
    page.reload()  # signs in with the stored token
    wait_for(
        lambda: page.evaluate("TM.charts.search && TM.charts.search.data.datasets.length") == 2,
        what="both trials' curves",
    )
    wait_for(lambda: page.evaluate("TM.charts.search.options.scales.y.type") == "logarithmic", what="a log scale")
    assert page.evaluate("TM.charts.search.options.scales.y.max") < 25  # the first loss does not set the range
    assert "trials: 2 completed (of 2)" in page.inner_text("#search-summary")
