"""Job-supplied regular expressions: compiled by RE2 and matched against bounded lines, so no pattern and no line
can stall a service. RE2 has no backreferences or lookarounds to backtrack and runs in time linear in the line, but
linear with a factor the pattern sets: its compiled size (`.{0,1000}` fifty times is 450,000 instructions, seconds
to compile and about a second a line), and a pattern within bounds can still make RE2's automaton give way to its
slower NFA (`a[ab]{900}c`: 908 instructions, ~50 ms on a 4,096-character line; `a[ab]{50}c` 4 ms with a small
memory). So compiling stops at `MAX_MEMORY` (a
millisecond's work), a program is at most `MAX_PROGRAM_SIZE` instructions (then compiled again with RE2's own memory
for matching), and a reader bounds the time a job's
patterns may take (`MatchBudget`)."""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeAlias

import re2

MAX_LINE_CHARS = 4096  # a metric sits near the start of an output line; the rest of a huge line is not read
VALUE_GROUP = "value"
MAX_MEMORY = 64 * 1024  # RE2's budget for a pattern checked (program and DFA cache): past it compiling stops at once
# instructions; a metric pattern has 20-400 (`step (?P<step>\d+) loss (?P<value>[0-9.]+)`: 26, `\p{L}+ (\d+)`: 1,206)
MAX_PROGRAM_SIZE = 2000

_CHECK = re2.Options()  # what a pattern is checked with: a compile that stops at MAX_MEMORY
_CHECK.log_errors = False  # a rejected pattern is the submitter's answer, not a line in our logs
_CHECK.max_mem = MAX_MEMORY
_OPTIONS = re2.Options()  # what a pattern that passed is matched with: RE2's own memory, its fast automaton's cache
_OPTIONS.log_errors = False
TOO_COMPLEX = "too complex: fewer or smaller {n,m} counts, alternatives or Unicode classes"
# The time a job's patterns may take in a reader (`MatchBudget`): 5% of a core, two seconds of it saved up. A usual
# pattern takes ~8 us on a 110-character line: three of them, 12 ms a second at the 500 lines a second a task may
# print (a job of several ranks printing that fast shares one budget: its lines past it are read in part).
MATCH_CPU_PER_S = 0.05
MATCH_BURST_S = 2.0
# A job's kept lines read again (a restart, a query of a finished job's curves): a second, and 200 us a line (25 usual
# searches), then nothing. A pattern that takes 50 ms a line (`a[ab]{900}c` on 4,096 characters) is read that long.
REPLAY_S = 1.0
REPLAY_PER_LINE_S = 200e-6

Pattern: TypeAlias = re2._Regexp
Match: TypeAlias = re2._Match


def compile_pattern(regex: str) -> Pattern:
    """The RE2 program of `regex`; ValueError saying why RE2 refuses it, or that it is too large to match cheaply
    (past `MAX_MEMORY` or `MAX_PROGRAM_SIZE`)."""
    try:
        pattern = re2.compile(regex, options=_CHECK)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        if "too large" in reason:
            raise ValueError(f"{TOO_COMPLEX} (RE2 would compile it past {MAX_MEMORY:,} bytes)") from exc
        raise ValueError(f"not a valid RE2 regular expression (no backreferences or lookarounds): {reason}") from exc
    if pattern.programsize > MAX_PROGRAM_SIZE:
        raise ValueError(
            f"{TOO_COMPLEX} (RE2 compiles it to {pattern.programsize:,} instructions, at most {MAX_PROGRAM_SIZE:,})"
        )
    return re2.compile(regex, options=_OPTIONS)


def value_group(pattern: Pattern) -> str | int:
    """Which group of a metric pattern carries the value: the named group `value`, else its one unnamed group
    (SageMaker's `loss=([0-9.]+)`); ValueError when it has neither."""
    if VALUE_GROUP in pattern.groupindex:
        return VALUE_GROUP
    unnamed = set(range(1, pattern.groups + 1)) - set(pattern.groupindex.values())
    if len(unnamed) != 1:
        raise ValueError(
            "needs the named group `value` (or exactly one unnamed group), e.g. "
            "`loss (?P<value>[0-9.]+)` or `loss=([0-9.]+)`"
        )
    return unnamed.pop()


def compile_metric(regex: str) -> Pattern:
    """A metric pattern: valid under RE2 and with a group that carries the metric (`value_group`)."""
    pattern = compile_pattern(regex)
    value_group(pattern)
    return pattern


def clip(line: str) -> str:
    """The part of a line that patterns are matched against."""
    return line[:MAX_LINE_CHARS]


@dataclass
class MatchBudget:
    """The time one job's patterns may take in a reader: `rate` seconds a second, `burst` saved up (full at
    first). A search past it is not run (no match), and counted: a job whose patterns cost more than the budget has
    only as many of its lines read as the budget pays for, and no pattern of one job slows the reader for others."""

    rate: float = MATCH_CPU_PER_S
    burst: float = MATCH_BURST_S
    clock: Callable[[], float] = time.monotonic
    # what a search takes: the time it runs (a reader's busy moments charge a little more; the thread's own CPU
    # clock is a system call, as long as a usual search)
    cpu: Callable[[], float] = time.perf_counter
    skipped: int = 0  # searches not run for want of budget
    reported: int = 0  # of them, those already said (`unreported`)
    tokens: float = field(init=False)
    at: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens, self.at = self.burst, self.clock()

    def search(self, pattern: Pattern, text: str) -> Match | None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + max(now - self.at, 0.0) * self.rate)
        self.at = now
        if self.tokens <= 0:
            self.skipped += 1
            return None
        began = self.cpu()
        try:
            return pattern.search(text)
        finally:
            self.tokens -= max(self.cpu() - began, 0.0)

    def admit(self) -> bool:
        """Whether there is budget left for one more line's reading (refilled first); counted as skipped if not."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + max(now - self.at, 0.0) * self.rate)
        self.at = now
        if self.tokens <= 0:
            self.skipped += 1
            return False
        return True

    def charge(self, seconds: float) -> None:
        """Work of a line's reading other than its searches (JSON, MLLOG, progress): paid from the same budget."""
        self.tokens -= seconds

    @classmethod
    def replaying(cls) -> "MatchBudget":
        """The budget of a job's kept lines read again: `REPLAY_S` to start, `grant`ed more a line, no refill."""
        return cls(rate=0.0, burst=REPLAY_S)

    def grant(self, seconds: float) -> None:
        """`seconds` more to spend, past the burst if need be (a line read again brings its own)."""
        self.tokens += seconds

    def unreported(self) -> int:
        """Searches skipped since the last call: a reader says so once an episode, not once a line."""
        count, self.reported = self.skipped - self.reported, self.skipped
        return count
