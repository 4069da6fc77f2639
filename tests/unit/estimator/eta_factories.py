"""Keyword-argument factories for estimator unit tests."""

import json

from services.estimator.model.corpus import Observation, Run


def mllog(key, value=None, *, t_ms, **metadata):
    """One `:::MLLOG` line."""
    rec = {
        "namespace": "",
        "time_ms": t_ms,
        "event_type": "POINT_IN_TIME",
        "key": key,
        "value": value,
        "metadata": {"file": "x.py", "lineno": 1, **metadata},
    }
    return ":::MLLOG " + json.dumps(rec)


def make_run(
    *,
    benchmark="bert",
    submitter="acme",
    work=1000.0,
    rate=10.0,
    batch_size=64.0,
    accelerator="NVIDIA H100-SXM5-80GB",
    accelerators_per_node=8,
    nodes=1,
    evals=10,
    run_id=None,
    **kwargs,
):
    """A run whose metric rises along an exponential curve and meets the target at `work`."""
    import math

    duration = work / rate
    run = Run(
        run_id=run_id or f"v4.0/{submitter}/sys/{benchmark}/0",
        version="4.0",
        submitter=submitter,
        system="sys",
        benchmark=benchmark,
        accelerator=accelerator,
        accelerators_per_node=accelerators_per_node,
        nodes=nodes,
        batch_size=batch_size,
        learning_rate=1e-3,
        run_start_ms=0,
        run_stop_ms=int(duration * 1000),
        status="success",
        **kwargs,
    )
    target = run.target
    obs = []
    for i in range(1, evals + 1):
        p = work * i / evals
        value = target + 0.2 * (math.exp(-3 * p / work) - math.exp(-3.0)) * (-1 if run.mode == "max" else 1)
        obs.append(Observation(t_s=p / rate, progress=p, value=value if i < evals else target))
    run.observations = obs
    return run
