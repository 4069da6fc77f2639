"""A task's output bytes as the lines to ship (pure): a newline ends a line; a carriage return ends an update that
the next one overwrites (tqdm, Keras and Lightning redraw their bars so), as does a line ending by moving the cursor
back up (nested tqdm bars). Of a run of updates only the latest is
shipped, at most every UPDATE_EVERY_S, and the last one of the run always: the log store gets the bar's progress,
not every frame of it."""

import math

UPDATE_EVERY_S = 2.0
MAX_LINE_BYTES = 2**20  # a longer line is shipped in pieces of this size
SKIP_TAIL_BYTES = 8192  # of output dropped unsplit, what is kept for the task's last lines
CUT_MOVES = 8  # how often a long line's cut may move back before a value (`OutputSplitter._cut`)
CURSOR_UP = "\x1b[A"  # a nested tqdm bar's frame ends so: the next newline only moves down to draw it again


class OutputSplitter:
    """Feed a stream's bytes as they come; ship what `feed`, `due` and `end` return, in order."""

    def __init__(self, *, every_s: float = UPDATE_EVERY_S) -> None:
        self.every_s = every_s
        self.partial = b""  # the segment not ended yet
        self.held: str | None = None  # the latest update not shipped yet
        self.shipped_at = -math.inf
        self.after_cr = False  # the last segment ended with a carriage return
        # values a long line's cut must not split (a task's secrets, the longest first: `jobsecrets.Masker`), so
        # the piece that holds one is masked
        self.whole: tuple[bytes, ...] = ()

    def feed(self, data: bytes, now: float) -> list[str]:
        """The lines `data` completes."""
        out: list[str] = []
        buffer, start = self.partial + data, 0
        # each looked for again only once passed: a look from every segment scanned the rest of the buffer (a 64-KiB
        # read of short lines with no carriage return, or of bar frames with no newline, was ~2 GB scanned)
        cr, nl = buffer.find(b"\r"), buffer.find(b"\n")
        while True:
            if 0 <= cr < start:
                cr = buffer.find(b"\r", start)
            if 0 <= nl < start:
                nl = buffer.find(b"\n", start)
            ends = [i for i in (cr, nl) if i >= 0]
            if not ends:
                break
            end = min(ends)
            segment = buffer[start:end].decode(errors="replace")
            if end == nl and not segment.endswith(CURSOR_UP):
                out += self._line(segment)
            else:
                out += self._update(segment, now)
                if end == cr and segment.replace(CURSOR_UP, "").strip():  # shipped or held: none after it is due
                    end = self._last_frame(buffer, end, nl)
            start = end + 1
        self.partial = buffer[start:]
        # cut once the bytes a value across the cut could still need are read (`_cut` looks that far past it): the
        # line's last piece (at its end, or `end`) may so be up to the longest value less a byte over the cap
        reach = max(map(len, self.whole), default=1) - 1
        while len(self.partial) > MAX_LINE_BYTES + reach:
            cut = self._cut(reach)
            out += self._line(self.partial[:cut].decode(errors="replace"))
            self.partial = self.partial[cut:]
        return out

    def _cut(self, reach: int) -> int:
        """Where a line too long is cut: after `MAX_LINE_BYTES`, or before a value of `whole` the cut would split
        (until 2026-11-30 a secret across it was shipped in two pieces, neither masked), at most `reach` (the
        longest value) back and after `CUT_MOVES` moves: values that overlap one another all along a line
        (`aaaa` in a run of `a`) would otherwise walk it back a byte at a time, and there any cut splits one."""
        cut, floor = MAX_LINE_BYTES, MAX_LINE_BYTES - reach
        for _ in range(CUT_MOVES):
            before = cut
            for value in self.whole:
                start = self.partial.find(value, max(0, cut - len(value) + 1), cut + len(value) - 1)
                if floor <= start < cut:
                    cut = start
            if cut == before:
                break
        return cut

    def skip(self, data: bytes) -> tuple[int, bytes] | None:
        """Drop `data` unsplit, up to its last newline or carriage return (lines and bar frames over the task's
        allowance): how many lines it ended and the bytes of its last ones (up to `SKIP_TAIL_BYTES`); None where it
        ends neither (then fed as usual: such a stream is cut into few long pieces anyway)."""
        buffer = self.partial + data
        cut = max(buffer.rfind(b"\n"), buffer.rfind(b"\r"))
        if cut < 0:
            return None
        self.partial, self.held, self.after_cr = buffer[cut + 1 :], None, buffer[cut : cut + 1] == b"\r"
        return buffer.count(b"\n", 0, cut + 1), buffer[max(0, cut - SKIP_TAIL_BYTES) : cut]

    def _last_frame(self, buffer: bytes, cr: int, nl: int) -> int:
        """Past a frame (not blank) ended by the carriage return at `cr`, the frames up to the next newline (`nl`, -1:
        none) are held one after the other, none shipped (one `feed` has one time: after a frame shipped or held, none
        is due), so the last of them is held at once and the run is passed; where that one is blank, each is gone
        through as before.
        A bar redrawn in a tight loop (`print(..., end="\\r")`) was a frame a few bytes long at a time: a core of the
        agent. Where the scan stopped (the carriage return ending the last frame held, or `cr`)."""
        last = buffer.rfind(b"\r", cr + 1, nl if nl >= 0 else len(buffer))
        if last < 0:
            return cr
        frame = buffer[buffer.rfind(b"\r", cr, last) + 1 : last].decode(errors="replace")
        if not frame.replace(CURSOR_UP, "").strip():
            return cr
        self.held, self.after_cr = frame, True
        return last

    def due(self, now: float) -> list[str]:
        """The held update, once UPDATE_EVERY_S has passed since the last one shipped (a bar that stopped moving)."""
        if self.held is None or now - self.shipped_at < self.every_s:
            return []
        held, self.held, self.shipped_at = self.held, None, now
        return [held]

    def end(self) -> list[str]:
        """What is left when the stream closes: the held update and the unended segment."""
        out = [self.held] if self.held is not None else []
        rest = self.partial.decode(errors="replace")
        self.held, self.partial = None, b""
        return out + ([rest] if rest else [])

    def _update(self, segment: str, now: float) -> list[str]:
        self.after_cr = True
        if not segment.replace(CURSOR_UP, "").strip():  # a bar cleared with spaces, a CR before the first frame
            return []
        self.held = segment
        return self.due(now)

    def _line(self, segment: str) -> list[str]:
        """A newline ends the run of updates: its last one is shipped (a `\\r` then `\\n` leaves it the line)."""
        held, self.held = self.held, None
        after_cr, self.after_cr = self.after_cr, False
        if not segment and after_cr:  # `\r\n`: the update was the line
            return [held] if held is not None else []
        if not segment.strip() and held is not None:
            return [held]
        return ([held] if held is not None else []) + [segment]
