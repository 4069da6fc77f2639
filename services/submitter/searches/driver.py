"""The search driver: each pass reads a search's trials (their jobs and metric points), stops those its pruner
rejects, starts new ones up to parallelism and budget, and stores the search. Every step is written before it is
done and every trial job has a deterministic id (`<search>-t<k>`), so a driver that restarts asks nothing twice
and loses no trial."""

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Protocol

from shared.lru import Lru
from shared.stored import stored_search
from services.submitter.refusals import Refused
from services.submitter.searches.models import SearchCreate, trial_reason
from services.submitter.searches.pruners import Point, Trial, decide
from services.submitter.searches.space import sample
from services.submitter.searches.store import Conflict, SearchStore
from services.submitter.views import SECRET_VALUES

log = logging.getLogger(__name__)
SETTLED_KEPT = 2048  # finished trials' curves kept (a few hundred points each)
SETTLE_S = 10.0  # a finished trial's points are final this long after its end (the estimator reads output late)
RETRY_MS, MAX_RETRY_MS = 2_000, 300_000  # a trial refused for now is asked again after this, doubling, at most
ACTIVE = ("Running",)


class Submitted(Exception):
    """The trial could not be submitted: `retry` (quota, budget, a service away) or not (an invalid trial)."""

    def __init__(self, reason: str, *, retry: bool) -> None:
        super().__init__(reason)
        self.reason, self.retry = reason, retry


class Port(Protocol):
    async def submit(self, search: dict, *, trial: int, job_id: str, parameters: dict) -> None: ...
    async def job(self, job_id: str) -> dict | None: ...
    async def points(self, job_id: str, *, metric: str) -> list[tuple[float, float, float | None]]: ...
    async def terminate(self, job_id: str, *, requested_by: str) -> None: ...


def trial_job_id(search_id: str, trial: int) -> str:
    return f"{search_id}-t{trial}"


def oriented(points: list[tuple[float, float, float | None]], mode: str) -> tuple[Point, ...]:
    """Metric points (unix time, value, step or null) as the pruners take them: lower is better, steps counted."""
    sign = -1.0 if mode == "max" else 1.0
    return tuple(
        Point(t, step if step is not None else i + 1, sign * value)
        for i, (t, value, step) in enumerate(points)
        if math.isfinite(value)
    )


def job_state(trial: dict, job: dict | None) -> tuple[str, str]:
    """(trial state, reason) from its job: a pruned trial stays Pruned whatever its job ends as."""
    if trial["state"] == "Pruned":
        return "Pruned", trial.get("reason", "")
    if job is None:
        return ("Failed", "its job was deleted") if trial.get("submitted") else ("Running", "")
    phase, reason = job["status"]["phase"], job["status"].get("reason", "")
    if phase == "Completed":
        return "Completed", ""
    if phase in ("Failed", "Terminated"):
        return "Failed", f"job {phase}: {reason}".rstrip(": ")
    return "Running", ""


def job_hours(job: dict | None, *, now_ms: int) -> tuple[float, float]:
    """(hours run, GPU-hours) of a trial's job so far."""
    if not job or not job["status"].get("start_time"):
        return 0.0, 0.0
    status, resource = job["status"], job["spec"]["resource"]
    hours = max(0, (status.get("end_time") or now_ms) - status["start_time"]) / 3_600_000
    return hours, hours * resource.get("gpu_count", 0) * resource.get("node_count", 1)


def room(doc: dict, spec: SearchCreate) -> tuple[int, str]:
    """How many trials may start now, and why not more."""
    if doc.get("stop_requested"):
        return 0, "stopped"
    if spec.max_gpu_hours is not None and doc.get("gpu_hours", 0) >= spec.max_gpu_hours:
        return 0, f"max_gpu_hours {spec.max_gpu_hours:g} spent"
    if spec.max_dollars is not None and doc.get("dollars", 0) >= spec.max_dollars:
        return 0, f"max_dollars {spec.max_dollars:g} spent"
    active = sum(1 for t in doc["trials"] if t["state"] in ACTIVE)
    left = spec.max_trials - len(doc["trials"])
    return max(0, min(spec.parallelism - active, left)), ""


def best(doc: dict, mode: str) -> dict | None:
    """The best trial so far among completed and running ones."""
    sign = -1.0 if mode == "max" else 1.0
    candidates = [
        t
        for t in doc["trials"]
        if (t["state"] in ("Completed", "Running") or t.get("stopped_running")) and t.get("value") is not None
    ]
    top = min(candidates, key=lambda t: (sign * t["value"], t["state"] != "Completed", t["trial"]), default=None)
    return None if top is None else {"trial": top["trial"], "parameters": top["parameters"], "value": top["value"]}


@dataclass
class Driver:
    store: SearchStore
    port: Port
    interval_s: float = 2.0
    # finished trials' final curves (bounded; a finished search's go with it)
    settled: Lru[str, tuple[Point, ...]] = field(default_factory=lambda: Lru(SETTLED_KEPT))

    # While no search runs, the running ones are read every `idle_s`, not every pass (a read every 2 s at rest, each
    # a scan of the collection on the embedded database): a search stored by this process is read at its next pass,
    # one another API replica stored within `idle_s` (that replica drives it meanwhile).
    idle_s: float = 30.0

    async def run_forever(self) -> None:
        running, inserted, read_at = True, -1, 0.0
        while True:
            if running or self.store.inserted != inserted or time.monotonic() - read_at >= self.idle_s:
                inserted, read_at = self.store.inserted, time.monotonic()
                running = await self.pass_once()
            await asyncio.sleep(self.interval_s)

    async def pass_once(self, *, now_ms: int | None = None) -> bool:
        """One step of every running search; whether any was running."""
        docs = await self.store.running()
        for doc in docs:
            try:
                await self.tick(doc, now_ms=now_ms)
            except Conflict:
                pass  # changed meanwhile (a stop): the next pass reads it afresh
            except Refused as exc:  # a service away (the estimator's metrics): the next pass asks again
                log.warning("search %s: pass skipped: %s", doc.get("_id"), exc.message)
            except Exception:
                log.exception("search %s: pass failed; retried on the next one", doc.get("_id"))
        return bool(docs)

    async def curve(self, trial: dict, job: dict | None, *, metric: str, mode: str, now_ms: int) -> tuple[Point, ...]:
        job_id = trial["job_id"]
        if (kept := self.settled.get(job_id)) is not None:
            return kept
        if job is None or not job["status"].get("start_time"):
            return ()
        points = oriented(await self.port.points(job_id, metric=metric), mode)
        end = job["status"].get("end_time") or 0
        if job["status"]["phase"] in ("Completed", "Failed", "Terminated") and end and now_ms - end > SETTLE_S * 1000:
            self.settled.put(job_id, points)
        return points

    async def tick(self, doc: dict, *, now_ms: int | None = None) -> dict:
        """One pass over one search; the stored document comes back."""
        now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        spec = SearchCreate.model_validate(stored_search(doc["spec"]))  # as stored: `shared.stored`
        metric, mode = spec.objective.metric, spec.objective.mode
        trials, hours, gpu_hours = [], 0.0, 0.0
        for entry in doc["trials"]:
            # a trial not marked submitted is looked for too: a stop that overtook the save after its submission
            # lost the mark, and its job then ran on, never terminated, after the search said Stopped
            looked = entry.get("submitted") or entry["state"] in ACTIVE
            job = await self.port.job(entry["job_id"]) if looked else None
            if job is not None and not entry.get("submitted"):
                entry["submitted"] = True
            state, reason = job_state(entry, job)
            points = await self.curve(entry, job, metric=metric, mode=mode, now_ms=now_ms)
            if job is not None:  # what it ran is kept: a trial job deleted later still counts against the budget
                entry["hours"], entry["gpu_hours"] = job_hours(job, now_ms=now_ms)
            hours, gpu_hours = hours + entry.get("hours", 0.0), gpu_hours + entry.get("gpu_hours", 0.0)
            entry.update(state=state, reason=trial_reason(reason or entry.get("reason", "")))
            if points:
                value = min(p.value for p in points)
                entry.update(value=-value if mode == "max" else value, step=points[-1].step)
            if (
                state == "Pruned"
                and job
                and job["status"]["phase"] not in ("Completed", "Failed", "Terminated", "Terminating")
            ):
                entry["terminate"] = True  # stored pruned, its job not yet told (a restart in between)
            trials.append(
                Trial(
                    trial=entry["trial"],
                    points=points,
                    done=state == "Completed",
                    stopped=state in ("Pruned", "Failed"),
                )
            )
        doc.update(gpu_hours=gpu_hours, dollars=hours * doc.get("dollars_per_hour", 0.0))
        if doc.get("stop_requested"):
            for entry in doc["trials"]:
                if entry["state"] in ACTIVE:
                    entry.update(
                        state="Failed",
                        reason=f"stopped with the search by {doc['stop_requested']}",
                        terminate=True,
                        stopped_running=True,  # still a candidate for the best (its values so far)
                    )
        else:
            running = {t.trial for t in trials if not t.done and not t.stopped}
            for number, why in decide(
                spec.pruner, trials, max_step=spec.objective.max_step, key=doc["_id"], only=running
            ).items():
                entry = doc["trials"][number]
                entry.update(state="Pruned", reason=trial_reason(why), terminate=True)
                log.info("search %s: trial %d pruned: %s", doc["_id"], number, why)
        count, why = room(doc, spec)
        for number in range(len(doc["trials"]), len(doc["trials"]) + count):
            doc["trials"].append(
                {
                    "trial": number,
                    "job_id": trial_job_id(doc["_id"], number),
                    "state": "Running",
                    "parameters": sample(spec.space, seed=doc["seed"], trial=number),
                    "value": None,
                    "step": None,
                    "reason": "",
                    "submitted": False,
                }
            )
        doc["message"] = why if why != "stopped" else ""
        doc = await self.store.save(doc)  # intentions first: a crash below is finished by the next pass
        await self.act(doc, now_ms=now_ms)
        return await self.finish(doc, spec)

    async def act(self, doc: dict, *, now_ms: int | None = None) -> None:
        """Tell pruned and stopped trials' jobs to end; submit trials not yet submitted, in order, until one is
        refused for now (a full queue, a quota, a service away: the next trials would be refused alike, each after
        its checks and its questions to placement and billing; they are asked again at a later pass, each refusal
        in a row doubling the wait, up to `MAX_RETRY_MS`: a search waiting for a month's quota asked placement and
        billing every 2 s)."""
        now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        waiting = now_ms < doc.get("retry_at_ms", 0)
        for entry in doc["trials"]:
            if entry.pop("terminate", False) and entry.get("submitted"):
                who = f"search {doc['_id']} ({entry['state'].lower()}: {entry['reason']})"[:500]
                await self.port.terminate(entry["job_id"], requested_by=who)
            if not waiting and not entry.get("submitted") and entry["state"] in ACTIVE:
                try:
                    await self.port.submit(
                        doc, trial=entry["trial"], job_id=entry["job_id"], parameters=entry["parameters"]
                    )
                    entry["submitted"] = True
                    doc.pop("refusals", None)
                    doc.pop("retry_at_ms", None)
                except Submitted as exc:
                    if exc.retry:
                        doc["message"] = f"trial {entry['trial']} waits: {exc.reason}"
                        doc["refusals"] = refusals = doc.get("refusals", 0) + 1
                        doc["retry_at_ms"] = now_ms + min(MAX_RETRY_MS, RETRY_MS * 2 ** min(refusals - 1, 16))
                        waiting = True
                    else:
                        entry.update(state="Failed", reason=trial_reason(exc.reason))

    async def finish(self, doc: dict, spec: SearchCreate) -> dict:
        doc["best"] = best(doc, spec.objective.mode)
        active = any(t["state"] in ACTIVE for t in doc["trials"])
        if not active and (doc.get("stop_requested") or room(doc, spec)[0] == 0):
            doc["phase"] = "Stopped" if doc.get("stop_requested") else "Completed"
            if SECRET_VALUES in doc:  # no trial starts any more: its secrets are nobody's (each trial keeps its own)
                doc[SECRET_VALUES] = {}
            for entry in doc["trials"]:
                self.settled.pop(entry["job_id"])
            doc["reason"] = doc.get("message") or (
                "stopped by " + doc["stop_requested"] if doc.get("stop_requested") else f"{len(doc['trials'])} trials"
            )
        return await self.store.save(doc)
