"""The researcher's portal: static pages under /ui that talk to the REST API with the user's bearer token."""

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.submitter import errors
from services.submitter.errors import ApiError

UI = Path(__file__).resolve().parent / "ui"
router = APIRouter(include_in_schema=False)
MEDIA = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".html": "text/html",
    ".svg": "image/svg+xml",
    ".md": "text/markdown",
}
# scripts only from the portal's own files (no inline script can run); style attributes are set by the pages
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
PORTAL_HEADERS = {"Cache-Control": "no-cache", "Content-Security-Policy": CSP, "X-Frame-Options": "DENY"}
EVERY_RESPONSE = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]


class SecurityHeaders:
    """nosniff and no referrer on every response (the portal's pages add their own Content-Security-Policy)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in EVERY_RESPONSE if k not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)


@router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse("/ui/")


@router.get("/ui")
async def ui_root() -> RedirectResponse:
    return RedirectResponse("/ui/")


@router.get("/ui/{path:path}")
async def ui(path: str) -> FileResponse:
    """A file of the portal; any other path is the single page (it routes on the URL's hash)."""
    target = (UI / path).resolve()
    if path and target.is_file() and target.is_relative_to(UI):
        return FileResponse(target, media_type=MEDIA.get(target.suffix), headers=PORTAL_HEADERS)
    if "." in Path(path).name:
        raise ApiError(404, errors.NOT_FOUND, f"/ui/{path} does not exist")
    return FileResponse(UI / "index.html", media_type="text/html", headers=PORTAL_HEADERS)
