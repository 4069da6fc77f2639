"""The API reference (Swagger UI at /docs, ReDoc at /redoc) from files the API serves itself: no CDN, no inline
script."""

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter(include_in_schema=False)
VENDOR = "/ui/vendor"
# the pages' own CSP: the portal's, plus the blob: worker ReDoc builds its search index in
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "worker-src 'self' blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
HEADERS = {"Cache-Control": "no-cache", "Content-Security-Policy": CSP, "X-Frame-Options": "DENY"}

SWAGGER = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>trainmaster API reference</title>
<link rel="stylesheet" href="{VENDOR}/swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="{VENDOR}/swagger-ui-bundle.js"></script>
<script src="/ui/apidocs/swagger-init.js"></script>
</body></html>
"""

REDOC = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>trainmaster API reference</title></head>
<body><redoc spec-url="/openapi.json"></redoc>
<script src="{VENDOR}/redoc.standalone.js"></script>
</body></html>
"""


@router.get("/docs")
async def swagger() -> HTMLResponse:
    return HTMLResponse(SWAGGER, headers=HEADERS)


@router.get("/redoc")
async def redoc() -> HTMLResponse:
    return HTMLResponse(REDOC, headers=HEADERS)
