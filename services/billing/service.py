"""Billing's parts, each over its own collections, and the one place they are put together."""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from pymongo.asynchronous.collection import AsyncCollection

from shared.clock import utcnow
from shared.noderecords import NodeLimits
from shared.store import DocumentStore
from services.billing.admission import Admission, QuotaBook
from services.billing.alerts import BudgetAlerts
from services.billing.attempts import Attempts
from services.billing.lifetimes import Lifetimes, Writes
from services.billing.live import LiveLines
from services.billing.placements import Placements
from services.billing.records import NodeRecords
from services.billing.reports import Reports


@dataclass(frozen=True)
class Billing:
    """What the handler table hands each event to: attempts (the attempt ledger, with the placements that vouch
    for them), lifetimes (nodes, with their records), reports (usage), admission (quotas), alerts (budgets)."""

    attempts: Attempts
    lifetimes: Lifetimes
    reports: Reports
    admission: Admission
    alerts: BudgetAlerts


def build(
    *,
    ledger: AsyncCollection,
    ends: AsyncCollection,
    nodes: AsyncCollection,
    nodes_open: AsyncCollection,
    node_info: AsyncCollection,
    quotas: AsyncCollection,
    alerts: DocumentStore,
    placements: Placements,
    static: dict[str, NodeLimits] | None,
    reconcile_grace_s: float = 60.0,
    clock: Callable[[], datetime] = utcnow,
) -> Billing:
    """Billing's parts over their collections; `static`: the static nodes' records (None: registrations taken as
    said, for in-memory tests only); `clock`: billing's own now, no report is charged past it."""
    live = LiveLines()  # every open line, and the closing ones: written by the attempts, read by the reports
    writes = Writes()  # the lifetimes' writes: a report reuses the lifetimes it read while none is made
    reports = Reports(ledger=ledger, live=live, nodes=nodes, nodes_open=nodes_open, clock=clock, writes=writes)
    book = QuotaBook(quotas=quotas)
    budgets = BudgetAlerts(store=alerts, book=book, reports=reports)
    records = NodeRecords(node_info=node_info, static=static)
    return Billing(
        attempts=Attempts(
            ledger=ledger,
            ends=ends,
            live=live,
            placements=placements,
            records=records,
            spent=budgets.check,
            reconcile_grace_s=reconcile_grace_s,
            clock=clock,
        ),
        lifetimes=Lifetimes(
            nodes=nodes, nodes_open=nodes_open, records=records, spent=budgets.check, clock=clock, writes=writes
        ),
        reports=reports,
        admission=Admission(book=book, reports=reports, placements=placements, changed=budgets.check),
        alerts=budgets,
    )
