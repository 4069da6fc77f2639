"""A search as the API takes and shows it (strict on write, every error naming its field)."""

import json
import math
import secrets
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from shared.jobs import MAX_PARAMETERS, PARAM_NAME_PATTERN, Float, Int, JobCreate, Strict, reserved_env

PRUNERS = ("none", "median", "hyperband", "predicted")
MAX_TRIALS = 1000
Name = Annotated[
    str,
    Field(
        min_length=1,
        max_length=48,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="Letters, digits, `_` and `-`; trial jobs are named `<name>-<k>`.",
    ),
]


Choice = Annotated[str, Field(max_length=256)] | Int | Float | bool
NUMERIC = ("float", "int")


class Param(Strict):
    """One dimension of the space: `float` or `int` in [low, high] (uniform, or in log with `log`), or
    `categorical` among `choices`. Checked field by field, so an error names e.g. `space.lr.low`."""

    type: Literal["float", "int", "categorical"]
    log: bool = Field(False, description="Sample the logarithm uniformly (low must be > 0).")
    low: Float | None = Field(None, validate_default=True, ge=-1e15, le=1e15)
    high: Float | None = Field(None, validate_default=True, ge=-1e15, le=1e15)
    choices: list[Choice] | None = Field(None, min_length=1, max_length=100, validate_default=True)

    @field_validator("log")
    @classmethod
    def _log_for_numbers(cls, log: bool, info: ValidationInfo) -> bool:
        if log and info.data.get("type") == "categorical":
            raise ValueError("only float and int dimensions have a log scale")
        return log

    @field_validator("low", "high")
    @classmethod
    def _bound(cls, value, info: ValidationInfo):
        kind = info.data.get("type")
        if kind not in NUMERIC:
            if value is not None:
                raise ValueError(f"only float and int dimensions have {info.field_name}")
            return value
        if value is None:
            raise ValueError(f"is required for a {kind} dimension")
        if kind == "int" and not float(value).is_integer():
            raise ValueError("must be an integer for an int dimension")
        if info.field_name == "low" and info.data.get("log") and value <= 0:
            raise ValueError("must be > 0 when log is true")
        low = info.data.get("low")
        if info.field_name == "high" and low is not None and (value < low or (kind == "float" and value == low)):
            raise ValueError(f"must be greater than low ({low})")
        return float(value) if kind == "float" else int(value)

    @field_validator("choices")
    @classmethod
    def _choices(cls, value, info: ValidationInfo):
        if info.data.get("type") == "categorical" and value is None:
            raise ValueError("is required for a categorical dimension")
        if info.data.get("type") in NUMERIC and value is not None:
            raise ValueError("only categorical dimensions have choices")
        return value

    def bounds(self) -> tuple[float, float]:
        """[low, high] of a float or int dimension (validation gives both to every numeric one)."""
        if self.low is None or self.high is None:
            raise ValueError(f"a {self.type} dimension without bounds")
        return self.low, self.high

    def options(self) -> list[Choice]:
        """The choices of a categorical dimension (validation gives every one some)."""
        if self.choices is None:
            raise ValueError(f"a {self.type} dimension has no choices")
        return self.choices


class Objective(Strict):
    metric: str = Field(
        pattern=PARAM_NAME_PATTERN,
        description="A metric of the template's algorithm.metrics (or one its output reports).",
    )
    mode: Literal["min", "max"] = "min"
    max_step: Float | None = Field(
        None,
        gt=0,
        le=1e15,
        description="The step a trial ends at, when known; "
        "otherwise the pruners learn it from the first completed trials.",
    )


class SearchCreate(Strict):
    """The body of POST /v2/{project_id}/searches."""

    name: Name = Field(
        default_factory=lambda: f"search-{secrets.token_hex(4)}",
        description="Absent: `search-` and 8 random hex digits.",
    )
    template: JobCreate = Field(description="A job body as POST /v2/{project_id}/training-jobs takes it.")
    space: dict[Annotated[str, Field(pattern=PARAM_NAME_PATTERN)], Param] = Field(min_length=1, max_length=50)
    objective: Objective
    max_trials: Int = Field(ge=1, le=MAX_TRIALS)
    max_gpu_hours: Float | None = Field(None, gt=0, le=1e7)
    max_dollars: Float | None = Field(None, gt=0, le=1e9)
    parallelism: Int = Field(1, ge=1, le=100)
    pruner: Literal["none", "median", "hyperband", "predicted"] = "none"
    seed: Int | None = Field(None, ge=0, le=2**31 - 1, description="Sampling seed (random when not given).")

    @model_validator(mode="after")
    def _template_fits(self) -> "SearchCreate":
        fixed = {p.name for p in self.template.algorithm.parameters}
        clash = sorted(fixed & set(self.space))
        if clash:
            raise ValueError(f"space names {', '.join(clash)} are also fixed parameters of template.algorithm")
        if self.objective.mode != next(
            (m.mode for m in self.template.algorithm.metrics if m.name == self.objective.metric), self.objective.mode
        ):
            raise ValueError("objective.mode differs from the mode of the template's metric of that name")
        return self


MAX_DOCUMENT_BYTES = 8 * 2**20  # a search's record, its trials included, at most (a database document holds 16 MiB)
TRIAL_REASON_CHARS = 500  # of a trial's reason, kept in the search's record (the whole one is its job's)
TRIAL_BYTES = 400 + 4 * TRIAL_REASON_CHARS  # a trial's record but its parameters, at most (UTF-8: 4 bytes a char)


def trial_reason(reason: str) -> str:
    """A trial's reason as the search's record keeps it."""
    return reason[:TRIAL_REASON_CHARS]


def largest_document(spec: SearchCreate) -> tuple[int, int]:
    """The most bytes a search's record could hold (its spec, and `max_trials` trials each with the longest value of
    each parameter), and a trial's record at most."""
    values = sum(len(name.encode()) + 16 + largest_value(param) for name, param in spec.space.items())
    trial = TRIAL_BYTES + values
    return len(json.dumps(spec.model_dump(mode="json")).encode()) + spec.max_trials * trial, trial


def largest_value(param: Param) -> int:
    """The bytes of the longest value a parameter may take in a trial's record."""
    if param.choices:
        return max(len(json.dumps(c, ensure_ascii=False).encode()) for c in param.choices)
    return 24


def unfit(spec: SearchCreate) -> tuple[str, str] | None:
    """(field, reason) where a new search's trials could not run: each is the template with the space's values added
    as parameters (at most MAX_PARAMETERS together, each an environment variable of the task). Checked when a search
    is made, not by the model: a search stored before these checks still reads back (its trials fail alone)."""
    if spec.template.algorithm.secret_names:
        return "template.algorithm.secret_names", "is set by trainmaster: give the values in algorithm.secrets"
    fixed = len(spec.template.algorithm.parameters)
    if fixed + len(spec.space) > MAX_PARAMETERS:
        return "space", (
            f"{len(spec.space)} names and template.algorithm.parameters' {fixed}: at most {MAX_PARAMETERS} together "
            "(a trial's job carries both)"
        )
    if taken := sorted(n for n in spec.space if reserved_env(n)):
        return "space", f"{taken[0]!r} is an environment variable trainmaster sets"
    if secret := sorted(set(spec.space) & set(spec.template.algorithm.secrets)):  # each trial's job would be refused
        return "space", f"{secret[0]!r} is also a secret of the template"
    size, trial = largest_document(spec)
    if size > MAX_DOCUMENT_BYTES:  # its record could no longer be written, and the search would stop moving
        most = max(0, (MAX_DOCUMENT_BYTES - (size - spec.max_trials * trial)) // trial)
        return "max_trials", (
            f"{spec.max_trials} trials of this space could make the search's record {size / 2**20:.1f} MiB (each "
            f"trial's record up to {trial:,} bytes), past {MAX_DOCUMENT_BYTES // 2**20} MiB: at most {most} trials "
            "(or shorter choices)"
        )
    return None


TrialState = Literal["Running", "Completed", "Pruned", "Failed"]


class Best(BaseModel):
    trial: int
    parameters: dict[str, Any]
    value: float


class TrialView(BaseModel):
    trial: int
    job_id: str
    parameters: dict[str, Any]
    state: TrialState
    value: float | None = None
    step: float | None = Field(None, description="The last step a metric point was seen at.")
    reason: str = ""


class SearchStatus(BaseModel):
    phase: Literal["Running", "Completed", "Stopped"]
    best: Best | None = None
    reason: str = ""
    gpu_hours: float = 0.0
    dollars: float = 0.0
    message: str = Field("", description="Why no new trial started on the last pass (quota, budget, service away).")


class SearchMetadata(BaseModel):
    id: str
    name: str
    project_id: str
    user_name: str
    create_time: int


class SearchView(BaseModel):
    metadata: SearchMetadata
    spec: dict[str, Any] = Field(description="The search as created.")
    status: SearchStatus
    trials: list[TrialView]


class SearchList(BaseModel):
    total: int
    items: list[SearchView]


class SearchAction(Strict):
    action_type: Literal["stop"]


def finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
