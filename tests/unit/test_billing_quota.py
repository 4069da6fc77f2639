from datetime import UTC, datetime

from shared.rpc import AdmitQuery, Quota, UsageTotals
from services.billing.quota import BUDGET_EXCEEDED, QUOTA_EXCEEDED, check, due_alerts, month_start


def ask(**kw) -> AdmitQuery:
    return AdmitQuery(project_id="p", user_name="ana", purpose="submit", **kw)


def test_no_limits_admit_anything():
    assert check(Quota(), scope="p", used=UsageTotals(spend=1e9), gpus_in_use=99, query=ask(gpus=8)) is None


def test_max_gpus_counts_the_gpus_in_use():
    quota = Quota(max_gpus=4)
    assert check(quota, scope="p", used=UsageTotals(), gpus_in_use=2, query=ask(gpus=2)) is None
    refused = check(quota, scope="p", used=UsageTotals(), gpus_in_use=3, query=ask(gpus=2))
    assert refused.error_code == QUOTA_EXCEEDED and "[p.max_gpus] quota exceeded" in refused.reason


def test_max_gpus_counts_the_gpus_queued_jobs_ask_for():
    quota = Quota(max_gpus=4)
    assert check(quota, scope="p", used=UsageTotals(), gpus_in_use=1, gpus_queued=1, query=ask(gpus=2)) is None
    refused = check(quota, scope="p", used=UsageTotals(), gpus_in_use=1, gpus_queued=2, query=ask(gpus=2))
    assert refused.error_code == QUOTA_EXCEEDED and "1 GPUs in use + 2 queued + 2 asked > 4" in refused.reason


def test_a_budget_refuses_what_the_month_cannot_pay_for():
    quota = Quota(budget_per_month=10)
    assert check(quota, scope="p", used=UsageTotals(spend=6), gpus_in_use=0, query=ask(estimated_cost=4)) is None
    refused = check(quota, scope="p/ana", used=UsageTotals(spend=6), gpus_in_use=0, query=ask(estimated_cost=5))
    assert (refused.allowed, refused.error_code, refused.http_status) == (False, BUDGET_EXCEEDED, 403)
    assert "p/ana.budget_per_month" in refused.reason and "$4.0000 left" in refused.reason


def test_gpu_hours_per_month():
    refused = check(
        Quota(gpu_hours_per_month=10),
        scope="p",
        used=UsageTotals(gpu_hours=9),
        gpus_in_use=0,
        query=ask(estimated_gpu_hours=2),
    )
    assert refused.error_code == QUOTA_EXCEEDED


def test_alerts_at_80_and_100_percent():
    quota = Quota(budget_per_month=100)
    assert due_alerts(quota, spent=79.9) == []
    assert due_alerts(quota, spent=80) == [80]
    assert due_alerts(quota, spent=120) == [80, 100]
    assert due_alerts(Quota(), spent=1e6) == []


def test_months_start_in_utc():
    assert month_start(datetime(2026, 11, 22, 4, 0, tzinfo=UTC)) == datetime(2026, 11, 1, tzinfo=UTC)
