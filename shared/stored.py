"""Jobs read back as they were stored: what a newer version's checks refuse must not make a stored job unreadable.

A metric pattern accepted when its job came may be refused now (since 2026-11-29, one too complex to match cheaply:
`shared.safe_regex`). Where a stored job is read back (placement's queue, the API's view, a search's template), such
a metric is left out, and the rest of the job reads as before; the estimator, which compiles each pattern itself,
reads no values with it either."""

from typing import Any

from pydantic import ValidationError

from shared.jobs import MetricSpec


def readable_algorithm(raw: Any) -> Any:
    """`raw` (a stored algorithm) with the metrics this version refuses left out; anything else as it is."""
    if not isinstance(raw, dict) or not isinstance(raw.get("metrics"), list):
        return raw
    kept = [m for m in raw["metrics"] if _readable(m)]
    return raw if len(kept) == len(raw["metrics"]) else {**raw, "metrics": kept}


def readable_template(raw: Any) -> Any:
    """A stored job template (a search's) with its algorithm's refused metrics left out."""
    if not isinstance(raw, dict) or "algorithm" not in raw:
        return raw
    return {**raw, "algorithm": readable_algorithm(raw["algorithm"])}


def _readable(metric: Any) -> bool:
    try:
        MetricSpec.model_validate(metric)
    except ValidationError:
        return False
    return True


def stored_search(raw: Any) -> Any:
    """A stored search's spec with its template's refused metrics left out."""
    if not isinstance(raw, dict) or "template" not in raw:
        return raw
    return {**raw, "template": readable_template(raw["template"])}
