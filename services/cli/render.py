"""Plain-text output: tables, durations, the progress bar with its ETA."""

import json
import math
import time
from collections.abc import Iterable, Sequence
from typing import Any

BAR_WIDTH = 24
FINISHED = ("Completed", "Failed", "Terminated")


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=False, default=str)


# Characters that change how the text around them is shown without being seen: the bidirectional embeddings,
# overrides, isolates and marks (a line that reads `cod.exe` while it holds `exe.doc`), the line and paragraph
# separators, zero-width spaces, joiners of words and invisible operators, and the byte-order mark. The zero-width
# (non-)joiners, which Persian words and emoji sequences need, are kept.
INVISIBLE = (0x061C, 0x200B, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2060, 0x2065), *range(0x2066, 0x206A))
SEPARATORS = (0x2028, 0x2029, 0xFEFF)


def _controls(keep: str) -> dict[int, str]:
    """C0 control characters but `keep`, DEL and the C1 ones, each shown as its `\\xNN` escape, and the invisible
    format characters and separators above as their `\\uNNNN` one."""
    shown = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if chr(c) not in keep}
    return shown | {c: f"\\u{c:04x}" for c in (*INVISIBLE, *SEPARATORS)}


_TEXT = _controls("\n\t")
_OUTPUT = _controls("\n\t\r")  # a job's own output keeps its carriage returns (a progress bar drawn in place)


def safe(text: str) -> str:
    """Text from the server as the terminal is to show it: a job's name or description, a reason, a message are
    anyone's in the project, and an escape sequence in them would drive the reader's terminal (set its clipboard,
    clear its screen, rewrite what was printed), and a bidirectional override would show its words in another
    order, so every control character and invisible format character is shown as its escape instead."""
    return text.translate(_TEXT)


def safe_output(text: str) -> str:
    """A job's output for a terminal: `safe`, its carriage returns kept (`trainmaster logs --raw` prints it as is)."""
    return text.translate(_OUTPUT)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns, two spaces apart, headers in capitals."""
    cells = [[str(h).upper() for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def ago(ms: int) -> str:
    return duration(time.time() - ms / 1000) + " ago" if ms else "-"


def progress_of(job: dict) -> float | None:
    eta = job["status"].get("eta") or {}
    if eta.get("progress") is not None:
        return eta["progress"]
    return 1.0 if job["status"]["phase"] == "Completed" else None


def eta_text(job: dict) -> str:
    """The remaining time and what it runs to: `to target 5m`, `target reached, ends in 3m`, `target unreachable
    before the end, ends in 8m`, or the time to the job's end alone."""
    eta = job["status"].get("eta")
    if not eta:
        return "-"
    phrase = eta_phrase(eta["remaining_s"], eta["low_s"], eta["high_s"])
    target, until = eta.get("target"), eta.get("until", "end")
    if target == "reached":
        return f"target reached, ends in {phrase}" if until == "end" else "target reached"
    if target == "unreachable":
        return f"target unreachable before the end, ends in {phrase}"
    return f"to target {phrase}" if until == "target" else phrase


def work_text(job: dict) -> str:
    """What the progress counts and who said so: `300/1000 it, 30.1 it/s, from tqdm`; empty when unknown."""
    eta = job["status"].get("eta") or {}
    if eta.get("done") is None or not eta.get("source"):
        return ""
    unit = f" {eta['unit']}" if eta.get("unit") else ""
    count = f"{eta['done']:g}/{eta['total']:g}{unit}" if eta.get("total") else f"{eta['done']:g}{unit}"
    rate = f", {eta['rate']:.3g}{unit or ' units'}/s" if eta.get("rate") else ""
    return f"{count}{rate}, from {eta['source']}"


WIDE_MIN_S = 20.0  # a band narrower than this is never "wide"


def eta_phrase(remaining: float, low: float, high: float) -> str:
    """`1m05s (50s–1m30s)` when the 10-90% band is narrow; a band wider than the estimate itself is shown as the
    rough range it is: `about 2 min, could be 1–6 min`."""
    if high - low >= max(remaining, WIDE_MIN_S):
        return f"about {rough(remaining)}, could be {rough_range(low, high)}"
    return f"{duration(remaining)} ({duration(low)}–{duration(high)})"


def rough(seconds: float) -> str:
    """A duration to the precision an uncertain estimate deserves: 5 s steps, whole minutes, half hours."""
    if seconds < 90:
        return f"{max(5, 5 * round(seconds / 5))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{round(seconds / 1800) / 2:g} h"


def rough_range(low: float, high: float) -> str:
    """`1–6 min`: both ends in the unit of the high end, the low end rounded down, the high end up."""
    if high < 90:
        step, unit = 5.0, "s"
    elif high < 90 * 60:
        step, unit = 60.0, "min"
    else:
        step, unit = 3600.0, "h"
    scale = 5.0 if unit == "s" else 1.0
    lo, hi = math.floor(low / step) * scale, max(math.ceil(high / step) * scale, 1.0)
    return f"{lo:g}–{hi:g} {unit}"


def progress_text(job: dict, *, detailed: bool = False) -> str:
    """`30%`, with its source (`30% tqdm`), or in full (`30% (300/1000 it, 30.1 it/s, from tqdm)`)."""
    fraction = progress_of(job)
    if fraction is None:
        return "-"
    source = (job["status"].get("eta") or {}).get("source")
    if detailed and (work := work_text(job)):
        return f"{fraction:.0%} ({work})"
    return f"{fraction:.0%} {source}" if source else f"{fraction:.0%}"


def bar(job: dict) -> str:
    """`name  Running  [#######.....]  42%  ETA 1m05s (48s–1m30s)  on local-1`."""
    status = job["status"]
    fraction = progress_of(job)
    filled = int(round((fraction or 0) * BAR_WIDTH))
    drawn = "#" * filled + "." * (BAR_WIDTH - filled) if fraction is not None else "?" * BAR_WIDTH
    parts = [job["metadata"]["name"], status["phase"], f"[{drawn}]", progress_text(job, detailed=True)]
    if status["phase"] not in FINISHED:
        parts.append(f"ETA {eta_text(job)}")
    parts.append(f"elapsed {duration(status['duration'] / 1000)}")
    if status.get("node_id"):
        parts.append(f"on {status['node_id']}")
    return "  ".join(parts)


def phase_line(job: dict) -> str:
    """`first-job: Running [Running] on local-1`: what a piped follow prints when the phase changes."""
    status = job["status"]
    secondary = status.get("secondary_phase") or status["phase"]
    where = ", ".join(status.get("node_ids") or []) or status.get("node_id") or ""
    return (
        f"{job['metadata']['name']}: {status['phase']}"
        + (f" [{secondary}]" if secondary != status["phase"] else "")
        + (f" on {where}" if where else "")
    )


def money(value: float | None) -> str:
    if value is None:
        return "unknown"
    return f"${value:.2f}" if value >= 1 else f"${value:.4f}"


def closing_line(job: dict, *, cost: float | None, exit_code: int) -> str:
    """`first-job (id): Completed after 21s on local-1, cost $0.0012, exit 0`."""
    status = job["status"]
    where = ", ".join(status.get("node_ids") or []) or status.get("node_id") or ""
    reason = f" ({status['reason']})" if status.get("reason") and status["phase"] != "Completed" else ""
    return (
        f"{job['metadata']['name']} ({job['metadata']['id']}): {status['phase']}{reason} after "
        f"{duration(status['duration'] / 1000)}"
        + (f" on {where}" if where else "")
        + f", cost {money(cost)}, exit {exit_code}"
    )


def job_row(job: dict) -> list[Any]:
    status = job["status"]
    return [
        job["metadata"]["id"],
        job["metadata"]["name"],
        job["metadata"]["user_name"],
        status["phase"] + (f"/{status['secondary_phase']}" if status["secondary_phase"] != status["phase"] else ""),
        ",".join(status.get("node_ids") or []) or "-",
        progress_text(job),
        eta_text(job),
        ago(job["metadata"]["create_time"]),
    ]


JOB_HEADERS = ("id", "name", "user", "phase", "node", "progress", "eta", "created")


def job_detail(job: dict, gpu: dict[str, float] | None = None) -> str:
    """The job; `gpu`: its GPUs now (`gpu_now`), shown when read."""
    meta, status, spec = job["metadata"], job["status"], job["spec"]
    resource, placement = spec["resource"], spec["placement"]
    lines = [
        f"{meta['name']}  ({meta['id']})",
        f"  project    {meta['project_id']}   user {meta['user_name']}   created {ago(meta['create_time'])}",
        f"  phase      {status['phase']} [{status['secondary_phase']}]   attempt {status.get('attempt', 0)}",
        f"  nodes      {', '.join(status.get('node_ids') or []) or '-'}   ran {duration(status['duration'] / 1000)}",
        f"  progress   {progress_text(job, detailed=True)}   ETA {eta_text(job)}",
        f"  resources  {resource['node_count']} node(s) x {resource['gpu_count']} GPU, {resource['cpu_count']} CPU, "
        f"{memory_text(resource)}   placement {placement['allowed']}/{placement['priority']}",
        f"  command    {job['algorithm']['command'].splitlines()[0][:100]}",
    ]
    if meta.get("description"):
        lines.insert(1, f"  {meta['description']}")
    if gpu and "gpu_util" in gpu:
        lines.append(f"  gpu        {gpu_text(gpu)}")
    if status.get("reason"):
        lines.append(f"  reason     {status['reason']}")
    for task in status.get("task_statuses") or []:
        lines.append(f"  {task['task']}   exit {task.get('exit_code')}   {task.get('message', '').strip()[:200]}")
    for attempt in status.get("attempts") or []:
        lines.append(
            f"  attempt {attempt['attempt']}  {', '.join(attempt['node_ids'])}  {attempt['reason']}"
            f" → {attempt.get('outcome') or 'running'}"
        )
    return "\n".join(lines)


def memory_text(resource: dict) -> str:
    """Host memory per node as asked; unset, placement's default (a GPU job's share of its node)."""
    return f"{resource['memory_gb']} GB" if resource.get("memory_gb") is not None else "default memory"


def gpu_now(report: dict) -> dict[str, float]:
    """The latest value of each GPU series (system series of `GET .../metrics`): gpu_util, gpu_memory_gb, ..."""
    return {s["name"]: s["points"][-1][1] for s in report.get("series") or [] if s.get("system") and s.get("points")}


def gpu_text(now: dict[str, float]) -> str:
    """`87% busy, 12.3 GB (peak 20.1 GB)`; `-` when no GPU was read."""
    if "gpu_util" not in now:
        return "-"
    text = f"{now['gpu_util']:.0f}% busy, {now.get('gpu_memory_gb', 0):.1f} GB"
    return text + (f" (peak {now['gpu_memory_peak_gb']:.1f} GB)" if "gpu_memory_peak_gb" in now else "")


def top_row(job: dict, now: dict[str, float]) -> list[Any]:
    status = job["status"]
    return [
        job["metadata"]["id"],
        job["metadata"]["name"],
        ",".join(status.get("node_ids") or []) or "-",
        progress_text(job),
        eta_text(job),
        _figure(now.get("gpu_util"), "{:.0f}%"),
        _figure(now.get("gpu_memory_gb"), "{:.1f}"),
        _figure(now.get("gpu_memory_peak_gb"), "{:.1f}"),
    ]


TOP_HEADERS = ("id", "name", "node", "progress", "eta", "gpu", "gpu_mem_gb", "peak_gb")


def _figure(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)
