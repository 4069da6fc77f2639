"""The researcher's portal: static pages under /ui that talk to the REST API with the user's bearer token."""
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse

from services.submitter import errors
from services.submitter.errors import ApiError

UI = Path(__file__).resolve().parent / "ui"
router = APIRouter(include_in_schema=False)
MEDIA = {".js": "text/javascript", ".css": "text/css", ".html": "text/html", ".svg": "image/svg+xml",
         ".md": "text/markdown"}


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
        return FileResponse(target, media_type=MEDIA.get(target.suffix), headers={"Cache-Control": "no-cache"})
    if "." in Path(path).name:
        raise ApiError(404, errors.NOT_FOUND, f"/ui/{path} does not exist")
    return FileResponse(UI / "index.html", media_type="text/html", headers={"Cache-Control": "no-cache"})
