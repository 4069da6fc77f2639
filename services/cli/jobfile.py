"""The create body: a YAML (or JSON) job file in the shape of POST /v2/{project}/training-jobs, then flags."""

import os
import sys
from pathlib import Path
from typing import Any

import yaml

from services.cli.client import EXIT_USAGE, CliError

RESOURCE_FLAGS = {
    "nodes": "node_count",
    "gpus": "gpu_count",
    "min_gpu_memory_gb": "min_gpu_memory_gb",
    "cpus": "cpu_count",
    "memory_gb": "memory_gb",
}
PLACEMENT_FLAGS = {"allowed": "allowed", "priority": "priority", "expected_duration": "expected_duration_s"}


def read(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text() if path != "-" else sys.stdin.read()
        body = yaml.safe_load(text) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise CliError(f"cannot read job file {path}: {exc}", exit_code=EXIT_USAGE) from None
    if not isinstance(body, dict):
        raise CliError(f"job file {path} must hold a mapping (the request body)", exit_code=EXIT_USAGE)
    return body


def pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"{flag} expects KEY=VALUE, got {item!r}", exit_code=EXIT_USAGE)
        out[key] = value
    return out


def secrets_from(names: list[str] | None, environ: dict[str, str]) -> dict[str, str]:
    """`--secret NAME`: the value of NAME in the CLI's own environment (a value on the command line would be in
    the shell's history and in every process listing)."""
    out = {}
    for name in names or []:
        if name not in environ:
            raise CliError(f"--secret {name}: set {name} in your environment first", exit_code=EXIT_USAGE)
        out[name] = environ[name]
    return out


def metric(text: str) -> dict[str, Any]:
    """`loss:REGEX[:min|max[:target]]`; the regex may itself hold colons, so mode and target are read from the end."""
    name, _, rest = text.partition(":")
    parts = rest.rsplit(":", 2)
    spec: dict[str, Any] = {"name": name, "regex": rest}
    if len(parts) == 3 and parts[1] in ("min", "max"):
        spec.update(regex=parts[0], mode=parts[1], target=float(parts[2]) if parts[2] else None)
    elif len(parts) >= 2 and parts[-1] in ("min", "max"):
        spec.update(regex=rest.rsplit(":", 1)[0], mode=parts[-1])
    if not name or not spec["regex"]:
        raise CliError(f"--metric expects NAME:REGEX[:min|max[:TARGET]], got {text!r}", exit_code=EXIT_USAGE)
    return spec


def body(args: Any) -> dict[str, Any]:
    """The job file (if any) with every given flag written over it."""
    job = read(args.file) if args.file else {}
    job.setdefault("kind", "job")
    meta = job.setdefault("metadata", {})
    algorithm = job.setdefault("algorithm", {})
    spec = job.setdefault("spec", {})
    if args.name:
        meta["name"] = args.name
    if args.description is not None:
        meta["description"] = args.description
    if args.command:
        algorithm["command"] = args.command
    if args.param:
        merged = {p["name"]: p["value"] for p in algorithm.get("parameters", [])} | pairs(args.param, "--param")
        algorithm["parameters"] = [{"name": k, "value": v} for k, v in merged.items()]
    if args.env:
        algorithm["environments"] = {**algorithm.get("environments", {}), **pairs(args.env, "--env")}
    if getattr(args, "secret", None):
        algorithm["secrets"] = {**algorithm.get("secrets", {}), **secrets_from(args.secret, dict(os.environ))}
    if args.metric:
        algorithm["metrics"] = [metric(m) for m in args.metric]
    for flag, field in RESOURCE_FLAGS.items():
        if getattr(args, flag) is not None:
            spec.setdefault("resource", {})[field] = getattr(args, flag)
    for flag, field in PLACEMENT_FLAGS.items():
        if getattr(args, flag) is not None:
            spec.setdefault("placement", {})[field] = getattr(args, flag)
    if args.max_duration is not None:
        spec["max_duration_s"] = args.max_duration
    if not algorithm.get("command"):
        raise CliError(
            "a job needs a command (--command, or a job file with algorithm.command); without a name "
            "(--name, metadata.name) the API gives it one",
            exit_code=EXIT_USAGE,
        )
    return job
