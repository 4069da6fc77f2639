"""The portal's search pages: served under the portal's Content-Security-Policy, linked from the navigation, and
every value they interpolate into HTML goes through an escaping or formatting helper."""

import re
from pathlib import Path

from tests.unit.api_app import client, make_app

UI = Path(__file__).resolve().parents[2] / "services" / "submitter" / "ui"
SAFE = re.compile(
    r"^(TM\.(esc|badge|ago)\(|num\(|encodeURIComponent\(|t\.trial( === bestTrial \? \" best\" : \"\")?$|"
    r"done$|names\.length \+ 5$|(names|search\.trials|page\.items)\.map\(|"
    r"t\.state === \"Pruned\" \? \"pruned\" : \"\"$|best \? num\()"
)


async def test_the_search_page_is_served_with_the_portal_policy_and_linked():
    app, _, _ = await make_app()
    async with client(app, None) as anonymous:
        response = await anonymous.get("/ui/pages/searches.js")
        assert response.status_code == 200 and "script-src 'self'" in response.headers["content-security-policy"]
        assert (await anonymous.get("/ui/searches")).status_code == 200  # the single page routes on the hash
    html = (UI / "index.html").read_text()
    assert '<script src="/ui/pages/searches.js"></script>' in html and 'href="#/searches"' in html


def test_every_interpolation_into_html_is_escaped_or_formatted():
    js = (UI / "pages" / "searches.js").read_text()
    for template in re.findall(r"`([^`]*)`", js, flags=re.S):
        if "<" not in template:
            continue  # not HTML (textContent, API paths)
        for expression in re.findall(r"\$\{([^}]*)", template):
            assert SAFE.match(expression.strip()), f"unescaped interpolation: ${{{expression}}}"
