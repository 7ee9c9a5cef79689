"""Every page of the built book in a real browser, with every request off this machine blocked.

Serves ``_build/html`` on 127.0.0.1 and drives Debian's Chromium (``/usr/bin/chromium``,
``apt-get install -y chromium``) through Playwright; no browser is ever downloaded. On every
page: no console errors, no failed or outside requests, math typeset by MathJax, every image
loaded, launch links well formed. On pages with widgets: every control is reached with Tab and
moved with the arrow keys, and each move changes the picture, with no Python kernel behind
the page. At a phone's width (390 px) no page scrolls sideways, and widget controls keep
usable tracks.

Reading: the sidebar buttons (☰ and "contents") open and close their drawers when tapped on
a phone and ☰ collapses the sidebar on a desktop; at 320, 360 and 390 px no formula is
clipped (defined at ``CLIPPED_MATH_JS``); at 1366 × 900 figures are sharp on high-density
screens, no code, output or table hides behind a sideways scroll, and each chapter's first
section starts within 1,350 px; the first screen of every chapter page (1366 × 900 and
390 × 844) shows its title, its lede, a picture and the first objective; the favicon is served; search snippets show no TeX; slider
handles have a name and a 24 px touch target, and kernel-only controls are not shown.

The accessibility gate (``axe_gate.py``): axe-core finds no serious or critical violation at
1366 or at 390 px.

Each page is loaded once (:func:`_crawl`): at 1366 px, then at 390 px, every probe of the
tests above reading that load; only the tests of a single behaviour (the drawers, ☰, the
clipped-math check, the favicon, search) load a page of their own.

``BOOK_HTML=/path/to/html`` runs these tests on a build made elsewhere (tests/book_support.py).

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

import axe_gate
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

# Every request off the machine goes to a proxy that is not there and fails (Chromium sends
# the loopback addresses past any proxy); _Browser records them.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic", "--proxy-server=http://127.0.0.1:9"]
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
        # Requests off the machine fail at Chromium's dead proxy (CHROMIUM_ARGS) and are
        # recorded here. (Not Playwright's request routing: it turns the HTTP cache off and
        # passes every request through Python, about 0.4 s more per page load.)
        context.on("request", self._record)

    def _record(self, request):
        if request.url.startswith(("data:", "blob:")):  # made in the page, never sent
            return
        if urlparse(request.url).hostname not in LOCAL_HOSTS:
            self.outside.append(request.url)

    def open(self, url: str, viewport: dict | None = None):
        """A new page at ``url`` (laid out at ``viewport`` from the start, when given), once
        loaded and its formulas typeset; and the list its console errors, page errors and
        failed requests are added to."""
        page = self.context.new_page()
        if viewport:
            page.set_viewport_size(viewport)
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


_PAGE_MEASURES = """() => {
    const nodes = Array.from(document.querySelectorAll('.math'));
    return {math: {total: nodes.length,
                   typeset: nodes.filter(n => n.querySelector('mjx-container')).length,
                   errors: document.querySelectorAll('mjx-merror').length},
            hrefs: Array.from(document.querySelectorAll('a[href]')).map(e => e.href)};
}"""


@pytest.mark.parametrize("docname", toc_docnames() + ["genindex", "search"])
def test_page(server, browser, docname):
    """Loaded offline at 1366 px (the desktop crawl, :func:`_measure_on_a_desktop`): every
    image on show loaded, every formula typeset without error, the launch links where they
    belong, no console error, no failed request and no request that left the machine."""
    found = _measure_on_a_desktop(server, docname, browser)
    assert not found["broken"], f"images that did not load: {found['broken']}"
    math = found["math"]
    assert math["typeset"] == math["total"], f"math not typeset: {math}"
    assert math["errors"] == 0, f"MathJax errors: {math}"

    hrefs = found["hrefs"]
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

    assert not found["problems"], "\n".join(found["problems"])
    assert not found["outside"], f"requests that left the machine: {found['outside']}"


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
    the smallest element of ``root`` that holds every image and text frame on show."""
    root.page.wait_for_timeout(250)
    found = root.evaluate("""r => {
        r.querySelectorAll('[data-picture]').forEach(e => e.removeAttribute('data-picture'));
        const shown = Array.from(r.querySelectorAll('img, .explorer-frame'))
            .filter(i => i.getClientRects().length && (i.tagName !== 'IMG' || i.naturalWidth > 0));
        if (!shown.length) return false;
        let box = shown[0].parentElement;
        while (!shown.every(i => box.contains(i))) box = box.parentElement;
        box.setAttribute('data-picture', '');
        return true;
    }""")
    assert found, "the widget shows no picture"
    return root.locator("[data-picture]").screenshot(animations="disabled")


def test_widget_pages_are_found():
    # Every chapter from 1 to 9 has an explorer, on one of its pages; the appendix links to
    # them, embedding none.
    chapters = {f"chapters/0{n}" for n in range(1, 10)}
    assert {page[:11] for page in WIDGET_PAGES} == chapters, WIDGET_PAGES
    assert len(WIDGET_PAGES) == 9, WIDGET_PAGES


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
    in turn, ArrowRight changes the picture, ArrowLeft puts it back (the crawl's last part)."""
    found = _crawl(server, docname, browser)["keyboard"]
    assert found["error"] is None, found["error"]
    assert not found["cut"], f"{docname}: control labels cut off: {found['cut']}"
    stand_ins = found["placeholders"]
    assert stand_ins and all(p["described"] and not p["shown"] for p in stand_ins), (
        f"{docname}: each explorer's first picture is in the page, described, and gives "
        f"way to the live explorer: {stand_ins}")
    assert not found["problems"], "\n".join(found["problems"])
    assert not found["outside"], f"requests that left the machine: {found['outside']}"


# The description of a visible control whose text does not fit its box ("temperat…").
CUT_LABELS = """() => Array.from(document.querySelectorAll('.cell_output .widget-label'))
    .filter(l => l.getClientRects().length && l.textContent.trim()
                 && l.scrollWidth > l.clientWidth + 1).map(l => l.textContent.trim())"""

# Per widget output: its first picture written into the page (_ext/explorer_placeholders.py),
# whether it has alt text (or is a text frame) and whether it is still shown.
PLACEHOLDERS = """() => Array.from(document.querySelectorAll(
        'script[type="application/vnd.jupyter.widget-view+json"]')).map(view => {
    const p = view.parentElement.querySelector('.explorer-placeholder');
    const images = p ? Array.from(p.querySelectorAll('img')) : [];
    const img = images.find(i => i.getClientRects().length);
    return {found: !!p, shown: !!p && p.getClientRects().length > 0,
            set: img ? img.className : images.length ? 'hidden' : 'text',
            described: !!p && (images.length ? images.every(i => (i.alt || '').length > 20)
                                             : p.textContent.trim().length > 0),
            loaded: !!p && (!img || img.naturalWidth > 0)};
})"""


def drive_every_control(page) -> None:
    """Tab through every widget of the page: each slider and dropdown takes the focus in turn,
    ArrowRight changes the picture and ArrowLeft puts it back (the test above)."""
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


# At a width the page overflows: the outermost elements that reach past the window outside
# any box of their own that scrolls or clips (the culprits named in the failure).
_SIDEWAYS_CULPRITS = """() => {
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
}"""


# Shape comments ("# (B, T, C)") in the code cells, and those whose first character is on
# show in the code box without scrolling it: [found, seen]. Folded cells are counted as they
# would be once opened (their width does not depend on the fold).
_SHAPE_COMMENTS = """() => {
    const shape = /#.*\\(\\s*\\w+(\\s*[-+*\\/]\\s*\\w+)*\\s*,[^)]*\\)|#.*\\(\\s*[A-Z]\\s*\\)/;
    let found = 0, seen = 0;
    document.querySelectorAll('.toggle-hidden').forEach(e => e.classList.remove('toggle-hidden'));
    document.querySelectorAll('details').forEach(d => { d.open = true; });
    for (const pre of document.querySelectorAll('div.cell_input pre')) {
        const box = pre.getBoundingClientRect();
        const right = box.left + pre.clientLeft + pre.clientWidth;
        for (const c of pre.querySelectorAll('span.c1')) {
            if (!shape.test(c.textContent) || !c.firstChild) continue;
            found++;
            const first = document.createRange();
            first.setStart(c.firstChild, 0);
            first.setEnd(c.firstChild, 1);
            const r = first.getBoundingClientRect();
            if (r.width && r.left >= box.left - 1 && r.right <= right + 1) seen++;
        }
    }
    return [found, seen];
}"""
MIN_SHAPE_COMMENTS_SEEN = 0.9  # of a page's shape comments, on show at 390 px


# Where the four parts of a chapter's first screen start, in px from the top of the page: the
# title (h1), the lede (the first paragraph after it), the picture (the first img or svg of
# a cell's output at least 120 px wide: not a copy button's icon) and the objectives (the first item of the first list that follows a
# paragraph of bold text alone, "After this page you can", in every language).
FIRST_SCREEN_JS = """() => {
    const top = e => e ? Math.round(e.getBoundingClientRect().top + window.scrollY) : null;
    const shown = e => e.getClientRects().length > 0;
    const h1 = document.querySelector('article h1');
    const lede = document.querySelector('article h1 ~ p');
    const picture = Array.from(document.querySelectorAll(
        'article .cell_output img, article .cell_output svg')).find(e => shown(e) &&
        !e.closest('button, .copybtn') && e.getBoundingClientRect().width >= 120);
    const heading = Array.from(document.querySelectorAll('article p')).find(p =>
        p.children.length === 1 && p.firstElementChild.tagName === 'STRONG' &&
        p.textContent.trim() === p.firstElementChild.textContent.trim() &&
        p.nextElementSibling && p.nextElementSibling.tagName === 'UL');
    const first = heading ? heading.nextElementSibling.querySelector('li') : null;
    return {title: top(h1), lede: top(lede), picture: top(picture), objectives: top(first)};
}"""
FIRST_LINE = 24  # px: the objectives' first line must be whole on the screen


def first_screen_problems(found: dict, height: int) -> list[str]:
    """What a first screen ``height`` px tall misses of the title, the lede, the picture and
    the objectives' first line (see ``FIRST_SCREEN_JS``)."""
    problems = [f"no {part}" for part, at in found.items() if at is None]
    problems += [f"{part} starts at {at} px" for part, at in found.items()
                 if at is not None and at + (FIRST_LINE if part == "objectives" else 0) > height]
    return problems


# Explorer pictures on show: which set each belongs to (the narrow frames for a phone, the
# wide ones, or a picture with one set), its natural and shown widths and its alt text; and
# the smallest font of the text frames on show (HTML, e.g. the KV-cache explorer's bars).
_EXPLORER_PICTURES = """() => {
    const shown = e => e.getClientRects().length > 0;
    const pictures = Array.from(document.querySelectorAll('.cell_output .explorer img'))
        .filter(shown)
        .map(i => ({set: i.closest('.explorer-narrow') ? 'narrow'
                         : i.closest('.explorer-wide') ? 'wide' : 'single',
                    natural: i.naturalWidth, loaded: i.complete && i.naturalWidth > 0,
                    shown: i.getBoundingClientRect().width, alt: i.getAttribute('alt') || ''}));
    const fonts = [];
    for (const frame of document.querySelectorAll('.cell_output .explorer .explorer-frame')) {
        if (!shown(frame)) continue;
        for (const e of [frame, ...frame.querySelectorAll('*')]) {
            const text = Array.from(e.childNodes).some(
                n => n.nodeType === Node.TEXT_NODE && n.textContent.trim());
            if (text && shown(e)) fonts.push(parseFloat(getComputedStyle(e).fontSize));
        }
    }
    return {pictures, smallestTextFrameFont: fonts.length ? Math.min(...fonts) : null};
}"""


def _explorer_pictures(page) -> dict:
    """:data:`_EXPLORER_PICTURES` once the pictures on show have loaded."""
    page.wait_for_function("""() => Array.from(document.querySelectorAll(
        '.cell_output .explorer img')).every(i => i.complete)""", timeout=15000)
    return page.evaluate(_EXPLORER_PICTURES)


@pytest.mark.parametrize("docname", toc_docnames() + ["genindex", "search"])
def test_page_fits_a_phone(server, browser, docname):
    """At 390 px nothing makes the page scroll sideways (wide code and tables scroll in their
    own boxes), widget controls stack with tracks wide enough to use, and at least 90 % of
    the shape comments in the code are on show (long lines wrap under themselves)."""
    found = _measure_on_a_phone(server, docname, browser)
    if found["scroll_width"] > found["view_width"]:
        pytest.fail(f"{docname} is {found['scroll_width']} px wide at {found['view_width']} px: "
                    f"{found['culprits']}")
    if docname in WIDGET_PAGES:
        tracks, pictures = found["tracks"], found["pictures"]
        assert tracks and min(tracks) >= MIN_TRACK, f"slider tracks of {tracks} px"
        assert pictures and max(pictures) <= PHONE["width"], f"pictures end at {pictures} px"
    comments, seen = found["shape_comments"]
    assert seen >= MIN_SHAPE_COMMENTS_SEEN * comments, (
        f"{docname}: {seen} of {comments} shape comments on show at 390 px")
    assert not found["problems_at_390"], "\n".join(found["problems_at_390"])


@pytest.mark.parametrize("docname", WIDGET_PAGES)
def test_explorers_show_their_narrow_pictures_on_a_phone(server, browser, docname):
    """At 390 px every explorer picture on show is a narrow frame (or a picture with one set
    of frames), shown at the scale ``tests/test_widgets_phone.py`` assumes (its natural
    width, or the phone's column if that is narrower), with its alt text; text frames are
    9 px or more. At 1366 px the wide frames are on show, not the narrow ones."""
    from transformer_lib.plotting.style import PHONE_COLUMN, PHONE_TEXT_PX

    for width, found in (("phone", _measure_on_a_phone(server, docname, browser)["explorers"]),
                         ("desktop", _measure_on_a_desktop(server, docname, browser)["explorers"])):
        pictures = found["pictures"]
        if found["smallestTextFrameFont"] is not None:
            assert found["smallestTextFrameFont"] >= PHONE_TEXT_PX, (
                f"{docname} ({width}): text frames at {found['smallestTextFrameFont']} px")
        if not pictures:
            assert found["smallestTextFrameFont"] is not None, f"{docname}: no explorer on show"
            continue
        assert all(p["loaded"] for p in pictures), f"{docname} ({width}): {pictures}"
        assert all(p["alt"] and p["alt"] != "explorer picture" for p in pictures), (
            f"{docname} ({width}): pictures without their alt text: {pictures}")
        sets = {p["set"] for p in pictures}
        if width == "phone":
            assert "wide" not in sets, f"{docname}: wide frames on a phone: {pictures}"
            small = [p for p in pictures if p["shown"] < min(p["natural"], PHONE_COLUMN) - 1]
            assert not small, f"{docname}: pictures shrunk below their phone scale: {small}"
        else:
            assert "narrow" not in sets, f"{docname}: narrow frames on a desktop: {pictures}"


# --- Reading: navigation, formulas, figures, the page's chrome -------------------------------

DESKTOP = {"width": 1366, "height": 900}  # CSS pixels of a common laptop screen
PHONE_WIDTHS = (320, 360, 390)  # narrow, small and common phones, upright
MAX_FIRST_SECTION_TOP = 1350  # px from the top of a chapter to its first section heading
CHAPTER_PAGES = [d for d in toc_docnames() if d.startswith("chapters/")]
ALL_PAGES = toc_docnames() + ["genindex", "search"]

# Clipped math, defined. A formula is the mjx-container MathJax draws (inline or display).
# Walk from it up through its ancestors, carrying the horizontal extent that must stay
# reachable: at first the formula's whole width (its drawing, mjx-math, even where that
# reaches past the container's own box). An ancestor that scrolls (overflow-x auto or scroll) makes everything inside
# it reachable, so from there on only that ancestor's own box has to stay reachable. An
# ancestor that clips (overflow-x hidden or clip) and ends before the extent does, by more
# than one pixel on either side, clips the formula. A formula that reaches past the window
# with no scrolling box of its own around it counts too: the reader would have to scroll
# the whole page sideways to see its end.
CLIPPED_MATH_JS = """root => {
    const scrolls = v => v === 'auto' || v === 'scroll';
    const clips = v => v === 'hidden' || v === 'clip';
    const found = [];
    const tex = new Map();
    const doc = window.MathJax && MathJax.startup && MathJax.startup.document;
    for (const item of (doc && doc.math) || []) tex.set(item.typesetRoot, item.math);
    for (const m of root.querySelectorAll('mjx-container')) {
        if (!m.getClientRects().length) continue;  // not on show (a folded block)
        if (m.closest('.bd-sidebar-secondary')) continue;  // headings repeated in "Contents"
        const r = m.getBoundingClientRect();
        // What MathJax drew (not its hidden copy for screen readers, which may be wider).
        const drawn = (m.querySelector(':scope > mjx-math') || m).getBoundingClientRect();
        let left = Math.min(r.left, drawn.left), right = Math.max(r.right, drawn.right);
        let clippedBy = null;
        if (scrolls(getComputedStyle(m).overflowX)) { left = r.left; right = r.right; }
        for (let a = m.parentElement; a && a !== document.documentElement; a = a.parentElement) {
            const style = getComputedStyle(a), box = a.getBoundingClientRect();
            const inner = {left: box.left + a.clientLeft,
                           right: box.left + a.clientLeft + a.clientWidth};
            if (clips(style.overflowX) && (left < inner.left - 1 || right > inner.right + 1)) {
                clippedBy = `<${a.tagName.toLowerCase()} class="${a.className}">`;
                break;
            }
            if (scrolls(style.overflowX)) { left = box.left; right = box.right; }
        }
        if (!clippedBy && (left < -1 || right > window.innerWidth + 1)) {
            clippedBy = 'the window';
        }
        if (clippedBy) {
            const what = tex.get(m) || m.textContent;
            found.push(`${m.getAttribute('display') === 'true' ? 'display' : 'inline'} ` +
                       `${Math.round(right - left)} px in ${clippedBy}: ${what.slice(0, 70)}`);
        }
    }
    return found;
}"""


def _clipped_math(page, root: str = "main") -> list[str]:
    """Formulas clipped in the page's text (``root``, the sidebars' copies of headings aside)."""
    return page.eval_on_selector(root, CLIPPED_MATH_JS)


def _phone(page, width: int = PHONE["width"], height: int = PHONE["height"]):
    """Make ``page`` a phone ``width`` CSS px wide: device scale 2, touch events, the page's
    viewport meta honoured. Returns the DevTools session (for :func:`_tap`)."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": height, "deviceScaleFactor": 2, "mobile": True})
    cdp.send("Emulation.setTouchEmulationEnabled", {"enabled": True, "maxTouchPoints": 5})
    page.wait_for_timeout(300)  # layout after the change
    return cdp


def _tap(cdp, x: float, y: float) -> None:
    """A finger's tap at (x, y) CSS px of the window: touch start and end (the browser
    makes the click from them, as on a phone)."""
    cdp.send("Input.dispatchTouchEvent", {"type": "touchStart", "touchPoints": [{"x": x, "y": y}]})
    cdp.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})


def _centre(locator) -> tuple[float, float]:
    box = locator.bounding_box()
    return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2


def _only_visible(page, selector: str):
    """The one element matching ``selector`` that is on show (failing if there is not one)."""
    shown = page.locator(f"{selector} >> visible=true")
    assert shown.count() == 1, f"{shown.count()} visible {selector!r} on the page"
    return shown


def _drawer_open(page, which: str) -> bool:
    return page.evaluate(f"() => !!document.querySelector('#pst-{which}-sidebar-modal')?.open")


@pytest.mark.parametrize("docname", ["chapters/01_attention", "intro"])
def test_sidebar_toggles_open_and_close_the_drawers_on_a_phone(server, browser, docname):
    """Tap ☰ at 390 px: the table of contents opens in a drawer; a tap beside it closes it.
    The same for the "contents" button (this page's sections) where the page shows one."""
    page, problems = browser.open(f"{server}/{docname}.html")
    try:
        cdp = _phone(page)
        for which, selector in (("primary", ".primary-toggle"),
                                ("secondary", ".secondary-toggle")):
            if which == "secondary" and not page.locator(f"{selector} >> visible=true").count():
                continue  # a page without sections has no "contents" button
            button = _only_visible(page, selector)
            assert not _drawer_open(page, which)
            _tap(cdp, *_centre(button))
            page.wait_for_timeout(300)
            assert _drawer_open(page, which), f"tapping {selector} did not open the {which} drawer"
            links = page.locator(f"#pst-{which}-sidebar-modal a >> visible=true")
            assert links.count() > 0, f"the {which} drawer is open but shows no links"
            drawer = page.locator(f"#pst-{which}-sidebar-modal").bounding_box()
            # Beside the drawer: the primary one is on the left, the secondary one on the right.
            x = PHONE["width"] - 8 if which == "primary" else 8
            assert not drawer["x"] <= x <= drawer["x"] + drawer["width"]
            _tap(cdp, x, PHONE["height"] / 2)
            page.wait_for_timeout(300)
            assert not _drawer_open(page, which), f"a tap beside the {which} drawer left it open"
        assert not problems, "\n".join(problems)
    finally:
        page.close()


def test_primary_toggle_collapses_the_sidebar_on_a_desktop(server, browser):
    """At 1366 px the table of contents is a sidebar; ☰ hides it and brings it back."""
    page, problems = browser.open(f"{server}/chapters/01_attention.html")
    try:
        page.set_viewport_size(DESKTOP)
        page.wait_for_timeout(300)
        sidebar = page.locator("#pst-primary-sidebar")
        article = page.locator("article.bd-article")
        assert sidebar.is_visible()
        wide_as_shown = article.bounding_box()["width"]
        button = _only_visible(page, ".primary-toggle")
        button.click()
        page.wait_for_timeout(600)  # the theme slides the sidebar out
        assert not sidebar.is_visible(), "☰ did not hide the sidebar"
        assert not _drawer_open(page, "primary"), "☰ opened a drawer on a desktop"
        assert article.bounding_box()["width"] >= wide_as_shown, "the text did not widen"
        button.click()
        page.wait_for_timeout(600)
        assert sidebar.is_visible(), "☰ did not bring the sidebar back"
        assert not problems, "\n".join(problems)
    finally:
        page.close()


def test_the_clipped_math_check_sees_clipping(server, browser):
    """The check itself, on boxes built to clip or not, and on two long formulas with the
    book's styles and with styles that clip (the theme's clipped wide formulas on phones)."""
    page, _ = browser.open(f"{server}/chapters/01_attention.html")
    try:
        found = page.evaluate("""() => {
            const box = document.createElement('div');
            box.id = 'math-cases';
            const wide =
                '<mjx-container style="display:inline-block;width:300px">x</mjx-container>';
            box.innerHTML =
                `<div id="hidden" style="width:100px;overflow:hidden">${wide}</div>` +
                `<div id="scrolls" style="width:100px;overflow-x:auto">${wide}</div>` +
                `<div id="nested" style="width:100px;overflow:hidden"><div ` +
                    `style="width:200px;overflow-x:auto">${wide}</div></div>` +
                `<div id="fits" style="width:400px;overflow:hidden">${wide}</div>`;
            document.querySelector('main').prepend(box);
            return true;
        }""")
        assert found
        assert len(_clipped_math(page, "#hidden")) == 1
        assert _clipped_math(page, "#scrolls") == []
        assert len(_clipped_math(page, "#nested")) == 1  # scrolls, but in a box that clips
        assert _clipped_math(page, "#fits") == []
        page.evaluate("() => document.getElementById('math-cases').remove()")

        # Two real formulas too wide for a phone, typeset by the page's MathJax: with the book's
        # styles neither is clipped; with the theme's `overflow: hidden` on math put back, and
        # a display formula's box that does not scroll, both are.
        long = " + ".join(f"x_{{{k}}} W_{{{k}}}" for k in range(14))
        page.evaluate("""async ([display, inline]) => {
            const box = document.createElement('div');
            box.id = 'long-formulas';
            const d = document.createElement('div');
            d.className = 'math notranslate nohighlight';
            d.textContent = display;
            const p = document.createElement('p');
            const s = document.createElement('span');
            s.className = 'math notranslate nohighlight';
            s.textContent = inline;
            p.append('so ', s, ' holds.');
            box.append(d, p);
            document.querySelector('main article').prepend(box);
            await MathJax.typesetPromise([box]);
        }""", [f"\\[{long}\\]", f"\\({long}\\)"])
        _phone(page, 320)
        page.evaluate("() => window.dispatchEvent(new Event('resize'))")  # book.js re-measures
        page.wait_for_timeout(300)
        assert _clipped_math(page, "#long-formulas") == []
        page.add_style_tag(content="""
            div.math, span.math { overflow: hidden !important; }
            div.math mjx-container { overflow: visible !important; }""")
        page.wait_for_timeout(300)
        clipped = _clipped_math(page, "#long-formulas")
        assert [c.split()[0] for c in clipped] == ["display", "inline"], clipped
    finally:
        page.close()


def _unfold(page) -> None:
    """Open every folded block (solutions, hints, folded code): what they hide is read too."""
    page.evaluate("""() => {
        document.querySelectorAll('.toggle-hidden')
            .forEach(e => e.classList.remove('toggle-hidden'));
        document.querySelectorAll('details').forEach(d => { d.open = true; });
    }""")


@pytest.mark.parametrize("docname", ALL_PAGES)
def test_no_formula_is_clipped_on_a_phone(server, browser, docname):
    """At 320, 360 and 390 px every formula, folded blocks opened, is whole on screen or
    scrolls in its own box (the phone crawl, :func:`_measure_on_a_phone`)."""
    found = _measure_on_a_phone(server, docname, browser)
    assert not found["clipped"], f"{docname}: clipped formulas (width: list): {found['clipped']}"
    assert not found["problems"], "\n".join(found["problems"])


_DESKTOP_MEASURES = """() => {
    const shown = e => e.getClientRects().length > 0;
    const inWidget = e => !!e.closest('.jupyter-widgets, .widget-vbox');
    const describe = e => `<${e.tagName.toLowerCase()} class="${e.className}"> ` +
        (e.textContent || '').trim().slice(0, 50);
    // Figures: pictures a cell drew (not the frames of an explorer, which have their own rule).
    const figures = Array.from(document.querySelectorAll('.cell_output img'))
        .filter(i => shown(i) && !inWidget(i))
        .map(i => ({src: (i.currentSrc || i.src).slice(0, 80),
                    svg: /\\.svg($|\\?)|^data:image\\/svg/.test(i.currentSrc || i.src),
                    natural: i.naturalWidth,
                    shown: Math.round(i.getBoundingClientRect().width)}));
    const sideways = Array.from(document.querySelectorAll(
            'article pre, article .cell_output .output, article table, ' +
            'article .pst-scrollable-table-container'))
        .filter(e => shown(e) && !inWidget(e) && e.scrollWidth > e.clientWidth + 1)
        .map(e => `${describe(e)} (${e.scrollWidth} > ${e.clientWidth} px)`);
    const h2 = document.querySelector('article h2');
    return {figures, sideways,
            firstSection: h2 ? Math.round(h2.getBoundingClientRect().top + window.scrollY) : null,
            icon: (document.querySelector('link[rel~="icon"]') || {}).href || null};
}"""


def _measure_on_a_desktop(base: str, docname: str, browser) -> dict:
    """What the desktop tests look at on one page at 1366 × 900 (:func:`_crawl`)."""
    return _crawl(base, docname, browser)["desktop"]


def _measure_on_a_phone(base: str, docname: str, browser) -> dict:
    """What the phone tests look at on one page at 390 px (:func:`_crawl`)."""
    return _crawl(base, docname, browser)["phone"]


def _failure(probe, *args) -> str | None:
    """Run ``probe``; what made it fail (its assertion or error), or None."""
    try:
        probe(*args)
    except Exception as error:  # noqa: BLE001 - reported by the test that reads the crawl
        return f"{type(error).__name__}: {error}"
    return None


@functools.lru_cache(maxsize=None)
def _crawl(base: str, docname: str, browser) -> dict:
    """Load ``docname`` once and measure everything the page's tests look at, in one crawl
    per width (the page is never loaded again for another test):

    - ``desktop``, at 1366 × 900: the page scrolled through, its images, formulas, figures,
      sideways boxes, first screen and explorers; the accessibility gate (``axe_gate``, every
      rule); on a widget page its slider handles (``HANDLES_JS``);
    - ``phone``, at 390 × 844: its width, slider tracks, pictures, first screen, shape
      comments and explorers; the gate again (colour contrast aside: it does not change with
      the width); then, every folded block opened, the clipped formulas at each of
      ``PHONE_WIDTHS``;
    - ``keyboard``, a widget page back at 1366 px: every control driven by the keyboard
      (:func:`drive_every_control`), last, so that nothing it moves is measured.

    Each part keeps the console errors and requests off the machine seen until its end."""
    widgets = docname in WIDGET_PAGES
    page, problems = browser.open(f"{base}/{docname}.html", viewport=DESKTOP)
    try:
        if widgets:
            _wait_for_widgets(page)
        _scroll_through(page)
        broken = _wait_for_images(page)
        page.wait_for_timeout(300)  # late console messages
        desktop = page.evaluate(_DESKTOP_MEASURES) | page.evaluate(_PAGE_MEASURES)
        desktop["first_screen"] = page.evaluate(FIRST_SCREEN_JS)
        if widgets:
            desktop["explorers"] = _explorer_pictures(page)
        desktop["axe"] = axe_gate.violations(page, problems=problems)
        if widgets:
            desktop["handles"] = page.evaluate(HANDLES_JS)
        desktop.update(broken=broken, problems=list(problems), outside=list(browser.outside))

        page.set_viewport_size(PHONE)
        axe_gate.settle(page)
        phone = {}
        phone["scroll_width"], phone["view_width"] = page.evaluate(
            "() => [document.documentElement.scrollWidth, window.innerWidth]")
        phone["culprits"] = (page.evaluate(_SIDEWAYS_CULPRITS)
                             if phone["scroll_width"] > phone["view_width"] else [])
        phone["tracks"] = page.eval_on_selector_all(
            ".cell_output .widget-slider .noUi-target",
            "els => els.filter(e => e.getClientRects().length).map(e => e.getBoundingClientRect().width)")
        phone["pictures"] = page.eval_on_selector_all(
            ".cell_output img",
            "els => els.filter(e => e.getClientRects().length).map(e => e.getBoundingClientRect().right)")
        phone["first_screen"] = page.evaluate(FIRST_SCREEN_JS)
        if widgets:
            phone["explorers"] = _explorer_pictures(page)
        phone["axe"] = axe_gate.violations(page, contrast=False, problems=problems)
        phone["shape_comments"] = page.evaluate(_SHAPE_COMMENTS)  # (opens the folds)
        phone["problems_at_390"] = list(problems)
        _unfold(page)
        phone["clipped"] = {}
        for width in PHONE_WIDTHS:
            cdp = _phone(page, width)
            clipped = _clipped_math(page)
            if clipped:
                phone["clipped"][width] = clipped
        phone["problems"] = list(problems)
        found = {"desktop": desktop, "phone": phone}

        if widgets:
            cdp.send("Emulation.clearDeviceMetricsOverride")
            cdp.send("Emulation.setTouchEmulationEnabled", {"enabled": False})
            page.set_viewport_size(DESKTOP)
            page.wait_for_timeout(300)
            seen = len(problems)
            error = _failure(drive_every_control, page)
            found["keyboard"] = {"error": error, "cut": page.evaluate(CUT_LABELS),
                                 "placeholders": page.evaluate(PLACEHOLDERS),
                                 "problems": problems[seen:], "outside": list(browser.outside)}
        return found
    finally:
        page.close()


@pytest.mark.parametrize("docname", ALL_PAGES)
def test_figures_are_sharp_on_high_density_screens(server, browser, docname):
    """Every figure a cell drew is SVG, or a PNG with at least 2 pixels per CSS pixel shown."""
    figures = _measure_on_a_desktop(server, docname, browser)["figures"]
    soft = [f"{f['src']}: {f['natural']} px drawn, {f['shown']} px shown" for f in figures
            if not f["svg"] and f["natural"] < 2 * f["shown"]]
    assert not soft, f"{docname}: figures under 2x: {soft}"


@pytest.mark.parametrize("docname", ALL_PAGES)
def test_nothing_hides_behind_a_sideways_scroll_on_a_desktop(server, browser, docname):
    """At 1366 px no code, output or table is wider than its box."""
    sideways = _measure_on_a_desktop(server, docname, browser)["sideways"]
    assert not sideways, f"{docname}: boxes that scroll sideways at 1366 px: {sideways}"


@pytest.mark.parametrize("docname", CHAPTER_PAGES)
def test_a_chapter_reaches_its_first_section_within_a_screen_and_a_half(server, browser, docname):
    """At 1366 × 900 a chapter's first section heading starts at most 1,350 px down the page:
    the chapter opens with its subject, not with setup."""
    top = _measure_on_a_desktop(server, docname, browser)["firstSection"]
    assert top is not None, f"{docname} has no section heading (h2)"
    assert top <= MAX_FIRST_SECTION_TOP, f"{docname}: first section at {top} px"


@pytest.mark.parametrize("docname", CHAPTER_PAGES)
def test_first_screen_shows_title_lede_picture_and_objectives_on_a_desktop(server, browser,
                                                                           docname):
    """At 1366 × 900 a chapter page's first screen shows its title, its one-sentence lede, a
    picture and the first line of its objectives (measured in the desktop crawl)."""
    found = _measure_on_a_desktop(server, docname, browser)["first_screen"]
    problems = first_screen_problems(found, DESKTOP["height"])
    assert not problems, f"{docname} at 1366 × 900: {problems} ({found})"


@pytest.mark.parametrize("docname", CHAPTER_PAGES)
def test_first_screen_shows_title_lede_picture_and_objectives_on_a_phone(server, browser,
                                                                         docname):
    """At 390 × 844 the same four parts start on the first screen (measured in the phone
    crawl, :func:`_measure_on_a_phone`)."""
    found = _measure_on_a_phone(server, docname, browser)["first_screen"]
    problems = first_screen_problems(found, PHONE["height"])
    assert not problems, f"{docname} at 390 × 844: {problems} ({found})"


@pytest.mark.parametrize("docname", ALL_PAGES)
def test_no_serious_accessibility_violation(server, browser, docname):
    """axe-core at 1366 and at 390 px: no violation of impact "serious" or "critical" (colour
    contrast at 1366 px only; ``axe_gate.py``)."""
    crawl = _crawl(server, docname, browser)
    found = {width: crawl[width]["axe"] for width in ("desktop", "phone")}
    if None in found.values():
        _missing(axe_gate.MISSING)
    assert not any(found.values()), f"{docname}: {found}"


def test_pages_have_a_favicon_that_is_served(server, browser):
    """Every page names an icon (the tab's, the bookmark's), and the server has it. (Fetched
    outside the page: Playwright's request routing does not pass icon requests on.)"""
    page, problems = browser.open(f"{server}/intro.html")
    try:
        href = page.evaluate(
            "() => (document.querySelector('link[rel~=\"icon\"]') || {}).href || null")
        assert href, "no <link rel=icon> on the page"
        assert urlparse(href).hostname in LOCAL_HOSTS, href
        response = page.request.get(href)
        assert response.status == 200, f"{href}: HTTP {response.status}"
        assert response.headers["content-type"].startswith("image/"), response.headers
        assert len(response.body()) > 100
        assert not problems, "\n".join(problems)
    finally:
        page.close()
    for docname in ALL_PAGES:
        found = _measure_on_a_desktop(server, docname, browser)
        assert found["icon"], f"{docname}: no <link rel=icon>"


def test_search_snippets_show_no_tex(server, browser):
    """Sphinx's search shows lines of each page found; math in them is left out, not shown
    as TeX source."""
    page, problems = browser.open(f"{server}/search.html?q=softmax")
    try:
        page.wait_for_function(
            "() => document.querySelectorAll('#search-results li p.context').length >= 3",
            timeout=20000)
        snippets = page.eval_on_selector_all("#search-results li p.context",
                                             "els => els.map(e => e.textContent)")
        tex = [s for s in snippets if re.search(r"\\[(\[]|\\[a-zA-Z]+\{|\$\$", s)]
        assert not tex, f"search snippets with TeX: {tex[:3]}"
        assert not problems, "\n".join(problems)
    finally:
        page.close()


# Slider handles on a widget page (the desktop crawl): how many, how many without a name, those
# a finger within 12 px of the centre misses, controls that need a kernel, "null" tooltips.
HANDLES_JS = """() => {
    const handles = Array.from(document.querySelectorAll('.widget-slider .noUi-handle'))
        .filter(h => h.getClientRects().length);
    const unnamed = handles.filter(h => !(h.getAttribute('aria-label') || '').trim());
    const small = [];
    for (const h of handles) {
        h.scrollIntoView({block: 'center'});
        const r = h.getBoundingClientRect();
        const x = r.left + r.width / 2, y = r.top + r.height / 2;
        for (const [dx, dy] of [[-11, 0], [11, 0], [0, -11], [0, 11]]) {
            const hit = document.elementFromPoint(x + dx, y + dy);
            if (!hit || !h.contains(hit)) {
                small.push(`${h.getAttribute('aria-label')} at ${dx},${dy}`);
                break;
            }
        }
    }
    // What says it needs a kernel, or is a button or a text box: shown, it does nothing.
    const kernelOnly = Array.from(document.querySelectorAll(
            '.cell_output .widget-button, .cell_output .widget-text input'))
        .filter(e => e.getClientRects().length).map(e => e.textContent || e.placeholder)
        .concat(Array.from(document.querySelectorAll('.cell_output .widget-vbox'))
            .filter(e => e.getClientRects().length)  // (innerText of a hidden box: all)
            .map(e => (e.innerText.match(/[^\\n]*needs a (running )?kernel[^\\n]*/i)
                       || [])[0])
            .filter(Boolean));
    return {handles: handles.length, unnamed: unnamed.length, small, kernelOnly,
            nullTitles:
                document.querySelectorAll('.jupyter-widgets [title="null"]').length};
}"""


@pytest.mark.parametrize("docname", WIDGET_PAGES)
def test_slider_handles_are_named_and_easy_to_touch(server, browser, docname):
    """Every slider handle has an accessible name, no label shows the tooltip "null", a finger
    within 12 px of a handle's centre (a 24 px target, WCAG 2.5.8) reaches it, and the
    controls that need a kernel are not shown in the static book (the desktop crawl)."""
    found = _measure_on_a_desktop(server, docname, browser)["handles"]
    assert found["handles"] > 0
    assert found["unnamed"] == 0, f"{found['unnamed']} slider handles without a name"
    assert found["nullTitles"] == 0, "widget labels with the tooltip 'null'"
    assert not found["small"], f"handles under a 24 px touch target: {found['small']}"
    assert not found["kernelOnly"], f"kernel-only controls shown: {found['kernelOnly']}"
