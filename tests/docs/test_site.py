"""The docs site as a reader gets it: built by mkdocs-material with --strict (what `make docs` does),
served over HTTP on loopback, and opened in a real headless browser (Debian's chromium), which runs the
theme's scripts before its DOM is read.

- the navigation lists every page of mkdocs.yml's nav, on every page;
- the API reference renders every top-level field of each kind's spec (from the models, not a list
  typed here), and each field's row links to its own section;
- no internal link of any page, as the browser resolves it, is broken (the page answers 200, and an
  anchor exists in the page it points into).
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlsplit
from urllib.request import urlopen

import pytest
import yaml

from tests.conftest import ROOT

MKDOCS = ROOT / ".venv" / "docs" / "bin" / "mkdocs"


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not MKDOCS.exists():
        pytest.skip(f"the docs builder is not installed ({MKDOCS}): run `make docs`")
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stderr[-4000:]}"
    return out


@pytest.fixture(scope="module")
def server(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):
    """dump(url) -> the DOM after the page's scripts ran, as chromium serialises it."""
    chromium = _chromium()
    if chromium is None:
        pytest.skip("chromium is not installed: run `make docs-deps`")
    profile = tmp_path_factory.mktemp("chromium-profile")

    @functools.cache
    def dump(url: str) -> str:
        env = {**os.environ, "HOME": str(profile)}
        done = subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",  # root here; the pages are our own, served from loopback
                "--disable-gpu",
                "--no-first-run",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-pings",
                # every name but loopback's resolves to nothing: the site must need nothing from outside,
                # and the browser sends nothing there (its own services included)
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                f"--user-data-dir={profile}",
                "--virtual-time-budget=3000",
                "--dump-dom",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert done.returncode == 0 and "<html" in done.stdout, f"chromium on {url}: {done.stderr[-2000:]}"
        return done.stdout

    return dump


class _Page(HTMLParser):
    """The links, ids and nav entries of a rendered page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.nav_links: list[str] = []
        self.resources: list[str] = []  # what the page loads: scripts, styles, images, fonts
        self._nav_depth = 0
        self._stack: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(found["id"] or "")
        if tag == "a" and found.get("name"):
            self.ids.add(found["name"] or "")
        classes = (found.get("class") or "").split()
        entering_nav = tag == "nav" and "md-nav--primary" in classes
        if entering_nav or self._nav_depth:
            self._nav_depth += 1 if tag not in _VOID else 0
        if tag in ("script", "img", "iframe") and found.get("src"):
            self.resources.append(found["src"] or "")
        loads = {"stylesheet", "preload", "modulepreload", "preconnect", "icon"}
        if tag == "link" and found.get("href") and loads & set((found.get("rel") or "").split()):
            self.resources.append(found["href"] or "")
        if tag == "a" and found.get("href"):
            self.links.append(found["href"] or "")
            if self._nav_depth:
                self.nav_links.append(found["href"] or "")

    def handle_endtag(self, tag: str) -> None:
        if self._nav_depth and tag not in _VOID:
            self._nav_depth -= 1


_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def _parse(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    return page


def _nav_files() -> list[str]:
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    files: list[str] = []

    def walk(entries: list) -> None:
        for entry in entries:
            value = entry if isinstance(entry, str) else next(iter(entry.values()))
            if isinstance(value, list):
                walk(value)
            else:
                files.append(value)

    walk(nav)
    return files


def _url_of(base: str, md: str) -> str:
    path = md.removesuffix(".md")
    path = path.removesuffix("index")
    return urljoin(base, path if not path or path.endswith("/") else path + "/")


def test_every_page_shows_the_whole_navigation(server: str, browser) -> None:
    expected = {urlsplit(_url_of(server, md)).path for md in _nav_files()}
    for md in _nav_files():
        url = _url_of(server, md)
        page = _parse(browser(url))
        shown = {urlsplit(urljoin(url, href)).path for href in page.nav_links}
        missing = expected - shown
        assert not missing, f"{md}: the navigation lacks {sorted(missing)}"


def test_api_reference_renders_every_top_level_field(server: str, browser) -> None:
    from rayship import api, generate

    url = urljoin(server, "reference/api/")
    html = browser(url)
    page = _parse(html)
    for kind in api.KINDS:
        crd = generate.crd(kind)
        root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        fields = list(root["properties"]["spec"]["properties"])
        assert fields, kind.kind
        assert kind.kind.lower() in page.ids, f"no section for {kind.kind}"
        spec_anchor = f"{kind.kind.lower()}-spec"
        assert spec_anchor in page.ids, f"no section for {kind.kind}.spec"
        # the spec's own section, up to the next one: a table row per field, its name the first cell
        section = html.split(f'id="{spec_anchor}"', 1)[1].split("<h3", 1)[0]
        for field in fields:
            row = rf"<td>(<a [^>]*>)?<code>{re.escape(field)}</code>"
            assert re.search(row, section), f"{kind.kind}.spec.{field} has no row in the spec's table"
            nested = root["properties"]["spec"]["properties"][field].get("properties")
            if nested:  # an object's row links to its own section, which is there
                anchor = f"{spec_anchor}-{field.lower()}"
                assert f"#{anchor}" in page.links, f"{kind.kind}.spec.{field}: no link to its section"
                assert anchor in page.ids, f"{kind.kind}.spec.{field}: its section is missing"


def test_pages_load_nothing_from_outside(server: str, browser) -> None:
    """A site behind a firewall (or read offline) renders as it does here: no font, script or style
    from a CDN (the theme's default Google Fonts included)."""
    for md in _nav_files():
        url = _url_of(server, md)
        outside = [r for r in _parse(browser(url)).resources if not urljoin(url, r).startswith(server)]
        assert not outside, f"{md} loads from outside the site: {outside}"


def test_no_internal_link_is_broken(server: str, browser) -> None:
    pages = {_url_of(server, md) for md in _nav_files()}
    broken: list[str] = []
    checked: dict[str, bool] = {}
    for url in sorted(pages):
        for href in _parse(browser(url)).links:
            target = urljoin(url, href)
            if not target.startswith(server):
                continue  # outside the site: not ours to check offline
            where, fragment = urldefrag(target)
            if where not in checked:
                try:
                    with urlopen(where, timeout=10) as answer:  # noqa: S310 (our own loopback server)
                        checked[where] = answer.status == 200
                except OSError:
                    checked[where] = False
            if not checked[where]:
                broken.append(f"{url} -> {href} (no page)")
                continue
            if fragment and where.endswith("/") and fragment not in _parse(browser(where)).ids:
                broken.append(f"{url} -> {href} (no anchor #{fragment})")
    assert not broken, "broken internal links:\n" + "\n".join(broken[:40])
