"""Why placement chose an option: a sentence from the options it weighed, recorded with the placement."""

from services.placement.policy.choice import Option
from services.placement.policy.models import JobRequest

MAX_CHARS = 400
SHOWN = 2  # alternatives named besides the choice


def where(option: Option) -> str:
    """`local-1 (local)`, `reserved-1 (reserved) once free`, `a new a10g.1x (on-demand)`."""
    if option.action == "provision" and option.instance is not None:
        return f"a new {option.instance.name} (on-demand)"
    views = [view for view, _ in option.picks] if option.picks else list(option.views or [])
    nodes = ", ".join(dict.fromkeys(view.node.id for view in views)) or "?"
    kind = views[0].node.kind.replace("_", "-") if views else "?"
    return f"{nodes} ({kind}){' once free' if option.action == 'wait' else ''}"


def _nodes(option: Option) -> tuple[str, ...]:
    if option.action == "provision":
        return ("provision", option.instance.name if option.instance else "")
    views = [view for view, _ in option.picks] if option.picks else list(option.views or [])
    return tuple(sorted({view.node.id for view in views}))


def _minutes(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def one(option: Option, *, now: float) -> str:
    charge = "rented" if option.paid else "owned"
    return f"{where(option)} ends in {_minutes(option.finish - now)}, ${option.cost:.4g} {charge}"


def explain(chosen: Option, options: list[Option], *, job: JobRequest, now: float) -> str:
    """The choice, the rule that made it, and the next best alternatives by finish time."""
    rule = (
        "time priority: the soonest finish, rented dollars weighed at the exchange rate"
        if job.priority == "time"
        else "cost priority: the fewest dollars, time weighed at a fraction of the exchange rate"
    )
    seen, others = {_nodes(chosen)}, list[Option]()
    for option in sorted((o for o in options if o is not chosen), key=lambda o: (o.finish, o.cost)):
        if _nodes(option) not in seen and len(others) < SHOWN:  # one line per node set: its soonest option
            seen.add(_nodes(option))
            others.append(option)
    text = f"{one(chosen, now=now)}; {rule}"
    if others:
        text += "; also weighed: " + "; ".join(one(o, now=now) for o in others)
    else:
        text += "; the only option"
    return text[:MAX_CHARS]
