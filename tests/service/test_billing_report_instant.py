"""A usage report is one instant's: an attempt or a node closing while the report reads the ledger (several queries,
awaits between them) is counted once, open or closed, in every table of the report. Before, an attempt closing
between the report's first query and its look at the open lines was counted in neither (a fresh suite run's
`test_usage_as_csv` failed so once)."""

import asyncio
from datetime import timedelta

import pytest

from shared.bus import publish
from shared.rpc import UsageQuery, UsageReport
from services.billing.ledger import STAMP, close_entry
from services.billing.live import LiveLines
from tests.factories import T0, exited, placed, started, submitted
from tests.service.test_billing_lifetimes import provisioned, released

HOUR = timedelta(hours=1)


async def one_running(broker, service, job_id: str = "j") -> None:
    """Job j placed and started at T0 on n1 (local, $1/h); billing's clock an hour on."""
    await publish(broker, submitted(job_id=job_id))
    await publish(broker, placed(job_id))
    service.attempts.clock.at(T0)
    await publish(broker, started(job_id, at=T0))
    service.attempts.clock.at(T0 + HOUR)
    assert list(service.attempts.running) == [f"{job_id}:1:0"]


def counted_once(report: UsageReport) -> None:
    """Every table of the report holds the one attempt once: an hour."""
    assert report.total.attempts == 1 and report.total.seconds == 3600.0
    assert sum(r.attempts for r in report.by_user) == 1
    assert sum(r.attempts for r in report.by_node_kind) == 1
    assert sum(r.attempts for r in report.groups) == 1


async def test_an_attempt_closing_between_the_reports_queries_is_counted_once(billing):
    broker, service, _ = billing
    await one_running(broker, service)
    ledger = service.attempts.ledger
    plain = ledger.aggregate
    calls = 0

    async def aggregate(pipeline):  # the end is handled once the report's first query has read the ledger
        nonlocal calls
        calls += 1
        result = await plain(pipeline)
        if calls == 1:
            await publish(broker, exited("j", at=T0 + HOUR))
        return result

    ledger.aggregate = aggregate
    counted_once(await service.reports.usage(UsageQuery(project_id="p")))
    assert calls > 1 and service.attempts.running == {}  # it closed mid-report
    del ledger.aggregate
    counted_once(await service.reports.usage(UsageQuery(project_id="p")))  # and after: closed, once


async def test_an_attempt_whose_close_is_being_written_when_the_report_starts_is_counted_once(billing):
    broker, service, _ = billing
    await one_running(broker, service)
    ledger = service.attempts.ledger
    gate, writing = asyncio.Event(), asyncio.Event()
    plain_write = ledger.replace_one

    async def replace_one(query, doc, **kw):  # the closed line's write waits for the report
        writing.set()
        await asyncio.wait_for(gate.wait(), 10)
        return await plain_write(query, doc, **kw)

    ledger.replace_one = replace_one
    plain_aggregate = ledger.aggregate

    async def aggregate(pipeline):  # ... and lands after the report's first query
        result = await plain_aggregate(pipeline)
        if not gate.is_set():
            gate.set()
            for _ in range(20):
                await asyncio.sleep(0)
        return result

    ledger.aggregate = aggregate
    closing = asyncio.create_task(publish(broker, exited("j", at=T0 + HOUR)))
    await asyncio.wait_for(writing.wait(), 10)
    assert list(service.attempts.live.writing) == ["j:1:0"]
    counted_once(await service.reports.usage(UsageQuery(project_id="p")))
    await asyncio.wait_for(closing, 10)
    stored = ledger.docs["j:1:0"]
    assert not stored.get("open") and stored[STAMP] > 0 and service.attempts.live.writing == {}
    counted_once(await service.reports.usage(UsageQuery(project_id="p")))


async def test_a_node_released_between_the_reports_reads_of_its_lifetime_is_counted_once(billing):
    broker, service, _ = billing
    await publish(broker, provisioned("od-1", at=T0))
    lifetimes = service.lifetimes
    reads = 0

    def closing_after_first_read(collection):
        plain = collection.find

        def find(query=None, projection=None):
            docs = list(plain(query, projection).docs)

            async def iterate():
                nonlocal reads
                for doc in docs:
                    yield doc
                reads += 1
                if reads == 1:  # the node's release lands between the report's two reads
                    await publish(broker, released("od-1", at=T0 + HOUR))

            return iterate()

        collection.find = find

    closing_after_first_read(lifetimes.nodes)
    closing_after_first_read(lifetimes.nodes_open)
    service.reports.clock = lambda: T0 + 2 * HOUR
    report = await service.reports.usage(UsageQuery(start=T0 - HOUR))
    assert reads == 2 and lifetimes.nodes_open.docs == {}  # released mid-report
    assert report.on_demand.nodes == 1
    assert round(report.on_demand.cost, 6) == 3.6  # its hour, once (not its hour and then an open hour more)


def test_stamps_keep_increasing_after_a_leader_whose_clock_was_ahead():
    live = LiveLines()
    live.resume(4e9)  # the ledger's latest stamp: drawn by a leader whose clock ran ahead
    first = live.stamp()
    assert first > 4e9 and live.stamp() > first


def test_a_closed_line_is_read_from_memory_until_every_earlier_write_has_landed():
    live = LiveLines(running={"a": {"_id": "a"}, "b": {"_id": "b"}})
    with live.closing({"_id": "a"}) as a:
        with live.closing({"_id": "b"}) as b:
            pass  # b lands while a's write is still under way
        live.running.pop("b")
        snap = live.snapshot()
        assert snap.cutoff == a.line[STAMP] and {d["_id"] for d in snap.closed} == {"a", "b"}
        assert snap.running == []  # a: being written, read as closed
    live.running.pop("a")
    assert live.landed == {} and live.writing == {}  # no write under way: the ledger has them all
    snap = live.snapshot()
    assert snap.cutoff > b.line[STAMP] and snap.closed == [] and snap.running == []


def test_a_refused_write_is_not_kept_and_a_failed_one_is_kept_in_doubt_under_its_stamp():
    live = LiveLines(running={"a": {"_id": "a"}})
    with live.closing({"_id": "a"}) as a:
        a.refused = True
        with live.closing({"_id": "c"}):
            pass
        assert set(live.landed) == {"c"}
    try:
        with live.closing({"_id": "a"}) as failed:
            raise OSError("lost")
    except OSError:
        pass
    assert live.writing == {} and live.landed == {} and list(live.doubt) == ["a"]
    snap = live.snapshot()  # landed or not: read as closed from memory, the ledger's copy (its stamp) not summed
    assert snap.running == [] and snap.closed == [failed.line] and snap.cutoff == failed.line[STAMP]
    later = live.stamp()
    with live.closing({"_id": "a"}) as again:  # its retry writes it under the same stamp
        assert again.again and again.line[STAMP] == failed.line[STAMP] < later
    assert live.doubt == {} and live.snapshot().closed == []


def test_a_line_in_doubt_is_settled_by_what_the_ledger_holds():
    live = LiveLines(running={"a": {"_id": "a"}, "b": {"_id": "b"}})
    for key in ("a", "b"):
        try:
            with live.closing({"_id": key}):
                raise OSError("lost")
        except OSError:
            pass
    stamps = {k: line[STAMP] for k, line in live.doubt.items()}
    assert live.settle("a", {"_id": "a", STAMP: stamps["a"]})  # it landed: kept as written
    assert not live.settle("b", {"_id": "b", "open": True})  # it did not: open again
    assert live.doubt == {} and live.landed == {}  # nothing under way: the ledger has what landed
    assert [d["_id"] for d in live.snapshot().running] == ["a", "b"]  # the caller forgets "a" as open
    assert not live.settle("a", None)  # settled once


async def test_a_close_whose_answer_was_lost_is_counted_once_until_and_after_its_retry(billing):
    """The closed line's write lands but its answer is lost (the write raises): the end is retried in place. Before,
    the line was open in memory and closed in the ledger meanwhile: a report counted its hour twice."""
    broker, service, _ = billing
    await one_running(broker, service)
    ledger = service.attempts.ledger
    plain_write = ledger.replace_one
    writes = 0

    async def replace_one(query, doc, **kw):  # the first write lands, then its answer is lost
        nonlocal writes
        writes += 1
        result = await plain_write(query, doc, **kw)
        if writes == 1:
            raise OSError("connection reset")
        return result

    ledger.replace_one = replace_one
    closing = asyncio.create_task(publish(broker, exited("j", at=T0 + HOUR)))
    for _ in range(200):
        if service.attempts.live.doubt:
            break
        await asyncio.sleep(0.01)
    stored = ledger.docs["j:1:0"]
    assert not stored.get("open") and list(service.attempts.live.doubt) == ["j:1:0"]  # landed, not known here
    counted_once(await service.reports.usage(UsageQuery(project_id="p")))
    await asyncio.wait_for(closing, 10)  # the retry: its filter (the open line) finds nothing, the stamp the same
    assert writes == 2 and ledger.docs["j:1:0"][STAMP] == stored[STAMP] and service.attempts.running == {}
    counted_once(await service.reports.usage(UsageQuery(project_id="p")))


@pytest.mark.parametrize("landed", [True, False])
async def test_a_close_whose_write_raised_and_was_not_retried_is_settled_by_reconciliation(billing, landed):
    broker, service, _ = billing
    await one_running(broker, service)
    attempts, ledger = service.attempts, service.attempts.ledger
    plain_write = ledger.replace_one

    async def raising(query, doc, **kw):  # landed with its answer lost, or not landed at all
        if landed:
            await plain_write(query, doc, **kw)
        raise OSError("connection reset")

    ledger.replace_one = raising
    with pytest.raises(OSError):
        await attempts._close("j:1:0", ended_at=T0 + HOUR, reason="exited")  # no retry comes (given up, say)
    del ledger.replace_one
    counted_once(await service.reports.usage(UsageQuery(project_id="p")))
    await attempts.reconcile(now=T0 + HOUR)
    assert attempts.live.doubt == {}
    assert bool(ledger.docs["j:1:0"].get("open")) is not landed
    assert list(attempts.running) == ([] if landed else ["j:1:0"])  # closed here too, or open again
    counted_once(await service.reports.usage(UsageQuery(project_id="p")))


async def test_an_end_seen_first_whose_closed_insert_lost_its_answer_is_kept_once_its_retry_is_refused(billing):
    """The start finds its end already seen and writes the line closed; the insert lands, its answer is lost, the
    retry's insert is refused by the line under its id: the same stamp, so this process's own, kept for reports
    while an older write (another attempt's close, begun first) holds the cutoff before it."""
    broker, service, _ = billing
    await one_running(broker, service, "k")
    live, ledger = service.attempts.live, service.attempts.ledger
    k = close_entry(live.running["k:1:0"], ended_at=T0 + HOUR, reason="exited")
    k_write = live.closing(k)  # k's close under way (its write not sent yet) from before j's first insert
    k_write.__enter__()
    await publish(broker, submitted(job_id="j"))
    await publish(broker, placed("j"))
    await publish(broker, exited("j", at=T0 + HOUR))
    plain_insert = ledger.insert_one
    inserts = 0

    async def insert_one(doc):
        nonlocal inserts
        inserts += 1
        result = await plain_insert(doc)
        if inserts == 1:
            raise OSError("connection reset")
        return result

    ledger.insert_one = insert_one
    service.attempts.clock.at(T0)  # the start, seen an hour before the end
    await asyncio.wait_for(publish(broker, started("j", at=T0)), 10)  # retried in place after the lost answer
    assert inserts == 2 and live.doubt == {} and list(live.writing) == ["k:1:0"]
    line = ledger.docs["j:1:0"]
    assert not line.get("open") and line[STAMP] > live.writing["k:1:0"][STAMP]
    service.attempts.clock.at(T0 + HOUR)
    report = await service.reports.usage(UsageQuery(project_id="p"))
    assert report.total.attempts == 2 and report.total.seconds == 7200.0  # k (being written) and j, once each
    k_stamp = live.writing["k:1:0"][STAMP]
    await ledger.replace_one({"_id": "k:1:0"}, {**k, STAMP: k_stamp})  # k's write lands
    k_write.__exit__(None, None, None)
    live.running.pop("k:1:0")
    report = await service.reports.usage(UsageQuery(project_id="p"))
    assert report.total.attempts == 2 and report.total.seconds == 7200.0


async def test_a_report_reuses_the_ledgers_sums_until_a_closed_line_is_written(billing, monkeypatch):
    """Admission asks the month's spend on every submission to a project with quotas: while no closed line was
    written here the ledger's sums are reused (the running lines are always read afresh); a close, a write under way
    or LEDGER_READ_TTL_S makes the next report read the ledger again."""
    broker, service, _ = billing
    reports = service.reports
    await one_running(broker, service)
    await publish(broker, exited("j", at=T0 + HOUR))
    await one_running(broker, service, "k")
    query = UsageQuery(project_id="p", start=T0 - HOUR)
    first = await reports.usage(query, spend_only=True)
    assert first.total.attempts == 2 and reports.ledger_reads.reused == 0
    service.attempts.clock.at(T0 + 2 * HOUR)
    reports.clock = lambda: T0 + 2 * HOUR
    again = await reports.usage(query, spend_only=True)
    assert reports.ledger_reads.reused > 0 and again.total.attempts == 2
    assert again.total.seconds == first.total.seconds + 3600  # k, running, charged to the later now
    reused = reports.ledger_reads.reused
    await publish(broker, exited("k", at=T0 + 2 * HOUR))  # a close: the sums are read again
    closed = await reports.usage(query, spend_only=True)
    assert reports.ledger_reads.reused == reused and closed.total.attempts == 2 and closed.total.seconds == 3 * 3600
    elsewhere = {**service.attempts.ledger.docs["k:1:0"], "_id": "x:1:0", "project_id": "q"}
    with service.attempts.live.closing(elsewhere):  # a write under way: neither reused nor kept
        await reports.usage(query, spend_only=True)
    await reports.usage(query, spend_only=True)
    assert reports.ledger_reads.reused == reused
    # a line another process wrote (a leader that lost its lease): seen once the reads are older than the TTL
    other = {**service.attempts.ledger.docs["k:1:0"], "_id": "m:1:0", "job_id": "m"}
    service.attempts.ledger.docs["m:1:0"] = other
    assert (await reports.usage(query, spend_only=True)).total.attempts == 2
    monkeypatch.setattr("services.billing.reports.LEDGER_READ_TTL_S", 0.0)
    assert (await reports.usage(query, spend_only=True)).total.attempts == 3
