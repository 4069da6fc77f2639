"""API errors in the style of Baidu BML's 4060xx table (seed 001): {"error_code", "error_msg"} naming the field."""
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

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
NO_PERMISSION = "406037"
PARAM_TOO_LONG = "406038"
UNAUTHENTICATED = "406039"
NOT_FOUND = "406040"
USER_EXISTS = "406041"


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


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
        field, detail = "body", "is not valid JSON"
    else:
        detail = error.get("msg", "invalid").removeprefix("Value error, ")
    message = f"param[{field}] invalid: {detail}"
    if len(exc.errors()) > 1:
        message += f" (and {len(exc.errors()) - 1} more problem(s))"
    return JSONResponse(status_code=400, content={"error_code": _validation_code(field, kind), "error_msg": message})


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(status_code=exc.status, content={"error_code": exc.code, "error_msg": exc.message})

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc)
