"""API errors in the style of Baidu BML's 4060xx table (seed 001): {"error_code", "error_msg"} naming the field.
The use cases raise domain refusals (`refusals`); `ANSWERS` is the one place that gives each its HTTP status and
error code."""

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pymongo.errors import ConnectionFailure
from starlette.exceptions import HTTPException

from services.submitter.refusals import (
    Conflicted,
    Invalid,
    NameTaken,
    NotAdmitted,
    NotFinished,
    NotFound,
    QueueFull,
    Refused,
    SearchesFull,
    ServiceAway,
    WrongPhase,
)

log = logging.getLogger(__name__)

INTERNAL = "406000"
PARAM_INVALID = "406001"
SERVICE_UNAVAILABLE = "406003"
QUOTA_EXCEEDED = "406008"
JOB_NOT_FOUND = "406012"
JOB_CANNOT_DELETE = "406014"
NAME_EMPTY = "406015"
NAME_TOO_LONG = "406016"
DESCRIPTION_TOO_LONG = "406018"
NAME_EXISTS = "406026"
JOB_STATUS = "406027"
LIMIT_REACHED = "406035"
NO_PERMISSION = "406037"
PARAM_TOO_LONG = "406038"
UNAUTHENTICATED = "406039"
NOT_FOUND = "406040"
USER_EXISTS = "406041"
TOO_MANY_REQUESTS = "406042"
CHANGED_MEANWHILE = "406043"
# Starlette's own answers (no route, wrong method, unparseable body) in the same shape.
HTTP_CODES = {
    400: PARAM_INVALID,
    401: UNAUTHENTICATED,
    403: NO_PERMISSION,
    404: NOT_FOUND,
    405: PARAM_INVALID,
    413: PARAM_TOO_LONG,
    415: PARAM_INVALID,
    429: TOO_MANY_REQUESTS,
}


# Each refusal of a use case: its HTTP status, its error code and the headers it carries. NotAdmitted passes on
# the status and code billing chose (403 and 406008 quota or 406029 budget).
ANSWERS: dict[type[Refused], tuple[int, str, dict[str, str] | None]] = {
    Invalid: (400, PARAM_INVALID, None),
    NotFound: (404, JOB_NOT_FOUND, None),
    NameTaken: (409, NAME_EXISTS, None),
    WrongPhase: (409, JOB_STATUS, None),
    NotFinished: (409, JOB_CANNOT_DELETE, None),
    Conflicted: (409, CHANGED_MEANWHILE, {"Retry-After": "1"}),
    NotAdmitted: (403, QUOTA_EXCEEDED, None),
    QueueFull: (429, LIMIT_REACHED, {"Retry-After": "10"}),
    SearchesFull: (429, LIMIT_REACHED, {"Retry-After": "10"}),
    ServiceAway: (503, SERVICE_UNAVAILABLE, {"Retry-After": "1"}),
}


def described(exc: Refused) -> tuple[int, str, str, dict[str, str] | None]:
    """(HTTP status, error code, error message, headers) of a use case's refusal."""
    status, code, headers = next(ANSWERS[kind] for kind in type(exc).__mro__ if kind in ANSWERS)
    if isinstance(exc, NotAdmitted):
        status, code = exc.status, exc.code or code
    message = f"param[{exc.field}] invalid: {exc.detail}" if isinstance(exc, Invalid) else exc.message
    return status, code, message, headers


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


def answer(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error_code": code, "error_msg": message}, headers=headers)


def field_path(loc: tuple) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    return ".".join(parts) or "body"


def _validation_code(field: str, kind: str) -> str:
    if field == "metadata.name" and kind in ("missing", "string_too_short"):
        return NAME_EMPTY
    if field == "metadata.name" and kind == "string_too_long":
        return NAME_TOO_LONG
    if field == "metadata.description" and kind == "string_too_long":
        return DESCRIPTION_TOO_LONG
    if kind in ("string_too_long", "too_long"):
        return PARAM_TOO_LONG
    return PARAM_INVALID


def validation_error(exc: RequestValidationError) -> JSONResponse:
    error = exc.errors()[0]
    field = field_path(tuple(error.get("loc", ())))
    kind = error.get("type", "")
    if kind == "json_invalid":
        field, detail = "body", f"is not valid JSON ({error.get('ctx', {}).get('error', 'decode error')})"
    elif kind == "extra_forbidden":
        detail = "unknown field (the API does not define it)"
    else:
        detail = error.get("msg", "invalid").removeprefix("Value error, ")
    message = f"param[{field}] invalid: {detail}"
    if len(exc.errors()) > 1:
        message += f" (and {len(exc.errors()) - 1} more problem(s))"
    return answer(400, _validation_code(field, kind), message)


def http_error(exc: HTTPException) -> JSONResponse:
    """Starlette's errors (no such route, method not allowed, a body that cannot be parsed) in the API's shape."""
    code = HTTP_CODES.get(exc.status_code, INTERNAL if exc.status_code >= 500 else PARAM_INVALID)
    detail = exc.detail if isinstance(exc.detail, str) else "invalid request"
    message = f"param[body] invalid: {detail}" if exc.status_code in (400, 413, 415) else detail
    return answer(exc.status_code, code, message, headers=getattr(exc, "headers", None))


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return answer(exc.status, exc.code, exc.message, exc.headers)

    @app.exception_handler(Refused)
    async def refused(_: Request, exc: Refused) -> JSONResponse:
        return answer(*described(exc))

    @app.exception_handler(HTTPException)
    async def starlette_error(_: Request, exc: HTTPException) -> JSONResponse:
        return http_error(exc)

    @app.exception_handler(ConnectionFailure)
    async def database_away(_: Request, exc: ConnectionFailure) -> JSONResponse:
        """The database did not answer in time (down, or overloaded): nothing of the request may be assumed done,
        and it can be repeated (a create's name is unique)."""
        log.warning("database unavailable: %r", exc)
        return answer(
            503, SERVICE_UNAVAILABLE, "the job store is unavailable right now; retry shortly", {"Retry-After": "2"}
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc)
