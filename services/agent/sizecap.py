"""How much a task's downloads may write to the node's disk: each download, and all of one task's together.

What a server says (Content-Length, a listing's sizes) only refuses early; the bytes actually written are counted,
decoded ones included (a small gzip body may expand to any size), and the download stops at the cap.
"""

from dataclasses import dataclass, field

GB = 2**30


class TooLarge(OSError):
    """A download passed its cap (the message says which)."""


def amount(size: int) -> str:
    return f"{size / GB:g} GB" if size >= GB else f"{size:,} bytes"


@dataclass
class Tally:
    """One task's downloads so far, against a cap per download and one for all of them (None: no cap)."""

    per_download: int | None = None
    per_task: int | None = None
    written: int = field(default=0, init=False)

    @classmethod
    def of(cls, *, per_download_gb: float, per_task_gb: float) -> "Tally":
        """Caps given in GB, 0 meaning none (as the settings give them)."""
        return cls(
            per_download=int(per_download_gb * GB) if per_download_gb else None,
            per_task=int(per_task_gb * GB) if per_task_gb else None,
        )

    def expect(self, size: int) -> None:
        """Refuse a download announced as `size` bytes before any of it is written."""
        self._check(size, self.written + size)

    def count(self, size: int, added: int) -> None:
        """`added` more bytes written, the download now `size` long; raise TooLarge past either cap."""
        self.written += added
        self._check(size, self.written)

    def _check(self, size: int, total: int) -> None:
        if self.per_download is not None and size > self.per_download:
            raise TooLarge(f"larger than the {amount(self.per_download)} one download may be")
        if self.per_task is not None and total > self.per_task:
            raise TooLarge(f"the task's downloads pass the {amount(self.per_task)} a task may fetch")
