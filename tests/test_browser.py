"""Every page of the built book in a real browser, with every request off this machine blocked.

Serves ``_build/html`` on 127.0.0.1 and drives Debian's Chromium (``/usr/bin/chromium``,
``apt-get install -y chromium``) through Playwright; no browser is ever downloaded. On every
page: no console errors, no failed or outside requests, math typeset by MathJax, every image
loaded, launch links well formed. On pages with widgets: every control is reached with Tab and
moved with the arrow keys, and each move changes the picture, with no Python kernel behind
the page. At a phone's width (390 px) no page scrolls sideways, and widget controls keep
usable tracks.

Without Chromium or Playwright the test skips with the reason, except in CI (``CI`` set),
where it fails instead.
"""
from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest

from book_support import (
    ensure_built_book,
    in_ci,
    launch_urls,
    notebook_docnames,
    source_of,
    toc_docnames,
)

pytestmark = [pytest.mark.browser, pytest.mark.book]

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
# html-manager can log this when a Stack-linked control moves fast; the picture still updates.
HARMLESS_CONSOLE = [re.compile(r"processLuminoMessage")]
PHONE = {"width": 390, "height": 844}  # CSS pixels of a common phone, upright
MIN_TRACK = 150  # px: the narrowest slider track still usable with a thumb


def _widget_docnames() -> list[str]:
    """Pages whose notebook shows a widget of transformer_lib.widgets (an ``…_explorer(`` call)."""
    pages = []
    for docname in notebook_docnames():
        cells = json.loads(source_of(docname).read_text())["cells"]
        code = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        if re.search(r"\b\w+_explorer\(", code):
            pages.append(docname)
    return pages


WIDGET_PAGES = _widget_docnames()


def _chromium() -> str:
    for candidate in (os.environ.get("CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium"):
        if candidate and Path(candidate).is_file():
            return candidate
    return ""


def _missing(reason: str):
    if in_ci():
        pytest.fail(f"{reason} (required in CI)")
    pytest.skip(reason)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    html = ensure_built_book()
    handler = functools.partial(_QuietHandler, directory=str(html))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


class _Browser:
    """One Chromium profile; records what goes wrong on the current page."""

    def __init__(self, context):
        self.context = context
        self.outside: list[str] = []
        context.route("**/*", self._route)

    def _route(self, route):
        url = route.request.url
        if urlparse(url).hostname in LOCAL_HOSTS:
            route.continue_()
        else:
            self.outside.append(url)
            route.abort()

    def open(self, url: str):
        page = self.context.new_page()
        problems: list[str] = []

        def on_console(msg):
            if msg.type == "error" and not any(p.search(msg.text) for p in HARMLESS_CONSOLE):
                problems.append(f"console error: {msg.text} @ {msg.location.get('url', '')}")

        page.on("console", on_console)
        page.on("pageerror", lambda err: problems.append(f"page error: {err}"))
        page.on("requestfailed", lambda req: problems.append(
            f"request failed: {req.url} ({req.failure})"))
        page.on("response", lambda res: res.status >= 400 and problems.append(
            f"HTTP {res.status}: {res.url}"))
        self.outside.clear()
        page.goto(url, wait_until="load")
        # MathJax typesets after its startup; widgets render at the load event.
        page.evaluate("""async () => {
            if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
                await MathJax.startup.promise;
            }
        }""")
        return page, problems


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium = _chromium()
    if not chromium:
        _missing("Chromium not found: apt-get install -y chromium (or set CHROMIUM=/path)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright for Python is not installed: pip install -r requirements.txt")
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=chromium, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900}, service_workers="block")
        try:
            yield _Browser(context)
        finally:
            context.close()


def _scroll_through(page) -> None:
    page.evaluate("""async () => {
        for (let y = 0; y < document.body.scrollHeight; y += 600) {
            window.scrollTo(0, y);
            await new Promise(r => setTimeout(r, 20));
        }
        window.scrollTo(0, 0);
    }""")


def _wait_for_images(page) -> list[str]:
    """Sources (shortened) of the images on show that did not load. (Images inside collapsed
    or unselected widget containers are not on show: a Stack draws only its selected frame.)"""
    page.wait_for_function("() => Array.from(document.images).every(i => i.complete)", timeout=15000)
    return page.evaluate("""() => Array.from(document.images)
        .filter(i => i.getClientRects().length > 0)
        .filter(i => !(i.complete && i.naturalWidth > 0))
        .map(i => (i.currentSrc || i.src || '(no src)').slice(0, 120))""")


@pytest.mark.parametrize("docname", toc_docnames() + ["genindex", "search"])
def test_page(server, browser, docname):
    page, problems = browser.open(f"{server}/{docname}.html")
    try:
        if docname in WIDGET_PAGES:
            _wait_for_widgets(page)
        _scroll_through(page)
        broken = _wait_for_images(page)
        assert not broken, f"images that did not load: {broken}"

        math = page.evaluate("""() => {
            const nodes = Array.from(document.querySelectorAll('.math'));
            return {total: nodes.length,
                    typeset: nodes.filter(n => n.querySelector('mjx-container')).length,
                    errors: document.querySelectorAll('mjx-merror').length};
        }""")
        assert math["typeset"] == math["total"], f"math not typeset: {math}"
        assert math["errors"] == 0, f"MathJax errors: {math}"

        hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
        if docname in notebook_docnames():
            expected = launch_urls(docname)
            colab = [h for h in hrefs if "colab.research.google.com" in h]
            binder = [h for h in hrefs if "mybinder.org" in h]
            assert colab == [expected["colab"]], colab
            assert binder == [expected["binder"]], binder
            assert re.fullmatch(r"https://colab\.research\.google\.com/github/[\w.-]+/[\w.-]+/blob/"
                                r"[\w.-]+/[\w/.-]+\.ipynb", colab[0])
        else:  # no launch buttons on a Markdown page; only the exercise page links Colab
            assert not any("mybinder.org" in h for h in hrefs)
            colab = [h for h in hrefs if "colab.research.google.com" in h]
            if docname == "appendix/exercise_notebooks":
                assert colab and all("/exercises/" in h for h in colab), colab
            else:
                assert not colab, colab

        page.wait_for_timeout(300)  # late console messages
        assert not problems, "\n".join(problems)
        assert not browser.outside, f"requests that left the machine: {browser.outside}"
    finally:
        page.close()


def _wait_for_widgets(page) -> None:
    views = page.locator('script[type="application/vnd.jupyter.widget-view+json"]').count()
    assert views > 0, "no widget views on the page"
    page.wait_for_function(f"() => document.querySelectorAll('.jp-OutputArea-output .widget-vbox, "
                           f".cell_output .widget-vbox').length >= {views}", timeout=30000)
    page.wait_for_function("() => Array.from(document.images).every(i => i.complete)", timeout=15000)


def _widget_roots(page):
    """The outermost widget box of every widget output on the page."""
    return page.locator(".cell_output .widget-vbox:not(.widget-vbox .widget-vbox)")


def _picture(root) -> bytes:
    """A screenshot of the widget's pictures only (not its controls, whose labels change too):
    the smallest element of ``root`` that holds every image on show."""
    root.page.wait_for_timeout(250)
    found = root.evaluate("""r => {
        r.querySelectorAll('[data-picture]').forEach(e => e.removeAttribute('data-picture'));
        const shown = Array.from(r.querySelectorAll('img'))
            .filter(i => i.getClientRects().length && i.naturalWidth > 0);
        if (!shown.length) return false;
        let box = shown[0].parentElement;
        while (!shown.every(i => box.contains(i))) box = box.parentElement;
        box.setAttribute('data-picture', '');
        return true;
    }""")
    assert found, "the widget shows no picture"
    return root.locator("[data-picture]").screenshot(animations="disabled")


def test_widget_pages_are_found():
    # The appendix gathers every widget; the reversal chapter shows the attention explorer.
    assert {"appendix/interactive_figures", "chapters/02_qkv_roles"} <= set(WIDGET_PAGES)


def _tab_to_next_control(page, root) -> str | None:
    """Press Tab; the kind of control that takes the focus ("slider", "select", or the tag of
    anything else focusable), or None once the focus has left the widget ``root``."""
    page.keyboard.press("Tab")
    return root.evaluate("""r => {
        const e = document.activeElement;
        if (!e || !r.contains(e)) return null;
        e.setAttribute('data-tabbed', '');
        if (e.classList.contains('noUi-handle')) return 'slider';
        return e.tagName.toLowerCase();
    }""")


@pytest.mark.parametrize("docname", WIDGET_PAGES)
def test_widget_controls_move_by_keyboard_and_change_the_picture(server, browser, docname):
    """From just before each widget, Tab through it: every slider and dropdown takes the focus
    in turn, ArrowRight changes the picture, ArrowLeft puts it back."""
    page, problems = browser.open(f"{server}/{docname}.html")
    try:
        _wait_for_widgets(page)
        roots = _widget_roots(page)
        assert roots.count() >= 1
        for r in range(roots.count()):
            root = roots.nth(r)
            root.scroll_into_view_if_needed()
            # Toggle buttons take the focus one button at a time and ignore the arrow keys.
            assert root.locator(".widget-toggle-buttons").count() == 0, (
                f"widget {r} has ToggleButtons, which the arrow keys do not move: use a Dropdown")
            root.evaluate("""r => {  // a focus point just before the widget
                const start = document.createElement('span');
                start.tabIndex = -1;
                r.parentElement.insertBefore(start, r);
                start.focus();
            }""")
            moved = 0
            for _ in range(40):
                kind = _tab_to_next_control(page, root)
                if kind is None:
                    break
                if kind not in ("slider", "select"):
                    continue
                before = _picture(root)
                page.keyboard.press("ArrowRight")
                after = _picture(root)
                assert before != after, f"{kind} {moved} of widget {r}: ArrowRight left the picture"
                page.keyboard.press("ArrowLeft")  # back, so the next control starts from frame 0
                assert _picture(root) == before, f"{kind} {moved} of widget {r}: ArrowLeft did not undo"
                moved += 1
            controls = root.locator(".noUi-handle, select")
            visible = [controls.nth(i) for i in range(controls.count()) if controls.nth(i).is_visible()]
            missed = [c.evaluate("e => e.closest('.jupyter-widgets').innerText")
                      for c in visible if c.get_attribute("data-tabbed") is None]
            assert visible and not missed, f"widget {r}: controls that Tab never reaches: {missed}"
            assert moved == len(visible)
        assert not problems, "\n".join(problems)
        assert not browser.outside, f"requests that left the machine: {browser.outside}"
    finally:
        page.close()


@pytest.mark.parametrize("docname", toc_docnames() + ["genindex", "search"])
def test_page_fits_a_phone(server, browser, docname):
    """At 390 px nothing makes the page scroll sideways (wide code and tables scroll in their
    own boxes), and widget controls stack with tracks wide enough to use."""
    page, problems = browser.open(f"{server}/{docname}.html")
    try:
        page.set_viewport_size(PHONE)
        if docname in WIDGET_PAGES:
            _wait_for_widgets(page)
        page.wait_for_timeout(300)  # layout after the resize
        scroll_width, view_width = page.evaluate(
            "() => [document.documentElement.scrollWidth, window.innerWidth]")
        if scroll_width > view_width:
            culprits = page.evaluate("""() => {
                const W = window.innerWidth;
                const boxed = e => {  // in a box that scrolls or clips on its own, or in a drawer
                    for (let a = e; a; a = a.parentElement) {
                        const style = getComputedStyle(a);
                        if (a !== e && ['auto', 'scroll', 'hidden'].includes(style.overflowX)) return true;
                        if (style.position === 'fixed') return true;
                    }
                    return false;
                };
                const wide = Array.from(document.querySelectorAll('body *')).filter(e =>
                    e.getClientRects().length && e.getBoundingClientRect().right > W + 1 && !boxed(e));
                return wide.filter(e => !wide.includes(e.parentElement)).slice(0, 5).map(e =>
                    `<${e.tagName.toLowerCase()} class="${e.className}"> ${(e.textContent || '').trim().slice(0, 60)}`);
            }""")
            pytest.fail(f"{docname} is {scroll_width} px wide at {view_width} px: {culprits}")
        if docname in WIDGET_PAGES:
            tracks = page.eval_on_selector_all(
                ".cell_output .widget-slider .noUi-target",
                "els => els.filter(e => e.getClientRects().length).map(e => e.getBoundingClientRect().width)")
            assert tracks and min(tracks) >= MIN_TRACK, f"slider tracks of {tracks} px"
            pictures = page.eval_on_selector_all(
                ".cell_output img",
                "els => els.filter(e => e.getClientRects().length).map(e => e.getBoundingClientRect().right)")
            assert pictures and max(pictures) <= PHONE["width"], f"pictures end at {pictures} px"
        assert not problems, "\n".join(problems)
    finally:
        page.close()
