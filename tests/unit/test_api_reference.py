"""The API reference (/docs, /redoc) loads only files the API serves itself, under a CSP that allows no inline
script."""

import re
from urllib.parse import urlsplit

from tests.unit.api_app import client, make_app


def referenced(html: str) -> list[str]:
    return re.findall(r'(?:src|href|spec-url)="([^"]+)"', html)


async def test_the_api_reference_pages_load_only_same_origin_files_that_exist():
    app, _, _ = await make_app()
    async with client(app, None) as anonymous:
        for page in ("/docs", "/redoc"):
            response = await anonymous.get(page)
            assert response.status_code == 200, page
            urls = referenced(response.text)
            assert urls, page
            for url in urls:
                parts = urlsplit(url)
                assert not parts.scheme and not parts.netloc and url.startswith("/"), (page, url)
                assert (await anonymous.get(url)).status_code == 200, (page, url)
            assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", response.text), page
            policy = dict(p.strip().split(" ", 1) for p in response.headers["content-security-policy"].split(";"))
            assert policy["script-src"] == "'self'" and policy["default-src"] == "'self'", page


async def test_the_portal_links_to_the_offline_api_reference():
    app, _, _ = await make_app()
    async with client(app, None) as anonymous:
        assert 'href="/docs"' in (await anonymous.get("/ui/")).text
