"""Why a use case says no: domain errors, raised by the submitter's use cases whoever calls them (a route, a search's
trials, a test). Each says what was refused in plain values; only the API's error handlers (`errors.ANSWERS`) turn
one into an HTTP status, a ModelArts error code and an error message."""


class Refused(Exception):
    """A use case refused; `message` says why, `field` names what was refused (a body field, or none)."""

    retry: bool = False  # whether the same call may succeed later unchanged (a cap, a quota, a service away)

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message, self.field = message, field


class Invalid(Refused):
    """A field of the request cannot be taken as it is."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(detail, field=field)
        self.detail = detail


class NameTaken(Refused):
    """Another existing job (or search) of the project has this name."""

    def __init__(self, name: str, *, project_id: str = "", what: str = "job") -> None:
        super().__init__(f"{what} name {name} already exists in project {project_id}", field="metadata.name")
        self.name, self.project_id, self.what = name, project_id, what


class NotFound(Refused):
    """No such job (or search), or none the caller may see: another project's job does not exist for them."""

    def __init__(self, ident: str, *, what: str = "job") -> None:
        super().__init__(f"{what} {ident} does not exist")
        self.ident, self.what = ident, what


class WrongPhase(Refused):
    """The job (or search) is in a phase the action does not apply to."""

    def __init__(self, ident: str, *, phase: str, done: str, what: str = "job", hint: str = "") -> None:
        super().__init__(f"{what} {ident} is {phase} and cannot be {done}{hint}")
        self.ident, self.phase = ident, phase


class NotFinished(Refused):
    """Only a finished job can be deleted."""

    def __init__(self, job_id: str, *, phase: str) -> None:
        super().__init__(
            f"job {job_id} is {phase}: only Completed, Failed or Terminated jobs can be deleted; terminate it first"
        )
        self.job_id, self.phase = job_id, phase


class QueueFull(Refused):
    """The project or the user already has its cap of jobs accepted and not yet running."""

    retry = True

    def __init__(self, *, scope: str, name: str, queued: int, cap: int) -> None:
        super().__init__(
            f"the queued job quantity of {scope} {name} has reached the upper limit ({queued} of {cap} "
            "not yet running); wait for some to start or terminate them"
        )
        self.scope, self.name, self.queued, self.cap = scope, name, queued, cap


class SearchesFull(Refused):
    """The project already has its cap of running searches (each keeps trials queued and running while it runs)."""

    retry = True

    def __init__(self, *, project_id: str, running: int, cap: int) -> None:
        super().__init__(
            f"the running search quantity of project {project_id} has reached the upper limit ({running} of {cap}); "
            "wait for one to finish or stop one"
        )
        self.project_id, self.running, self.cap = project_id, running, cap


class Conflicted(Refused):
    """Other requests changed what this one reads and writes each time it tried: the same request may pass now."""

    retry = True

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(detail, field=field)


class NotAdmitted(Refused):
    """Billing refused the job: a quota or budget of the project or user cannot take it. Billing's answer names the
    code and status the API answers with (`AdmitReply.error_code`, `.http_status`): they are passed on as given."""

    retry = True

    def __init__(self, reason: str, *, code: str, status: int) -> None:
        super().__init__(reason)
        self.code, self.status = code, status


class ServiceAway(Refused):
    """A service that owns the answer did not give it in time."""

    retry = True

    def __init__(self, service: str, error: BaseException) -> None:
        super().__init__(f"{service} service did not answer: {error!r}")
        self.service = service
