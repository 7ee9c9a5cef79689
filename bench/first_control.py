"""Time to an explorer's first control, in the built book, offline.

Run by hand (``python bench/first_control.py [book folder]``) after ``make book``; it is not a
test. For every page with an explorer, the page is loaded ``--loads`` times from a local
server in headless Chromium (``/usr/bin/chromium``, or ``$CHROMIUM``), with every request
that would leave the machine blocked, each load in a fresh browser context (no cache), and
the time from navigation start to two moments is recorded:

- ``picture``: the first explorer picture on show (a placeholder frame, or the live
  explorer's picture), the moment the reader sees what the explorer is about;
- ``control``: the first live control (a slider handle or a dropdown) on show.

Each is measured as is and with the CPU slowed 4× (Chrome DevTools Protocol,
``Emulation.setCPUThrottlingRate``), the usual stand-in for a mid-range phone. Prints a
Markdown table of the medians in milliseconds.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import os
import statistics
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FIRST_PICTURE = """() => {
    const shown = e => e.getClientRects().length && e.getBoundingClientRect().height > 20;
    return Array.from(document.querySelectorAll('.cell_output .explorer-placeholder img, '
        + '.cell_output .widget-image, .cell_output .explorer-frame')).some(shown);
}"""
FIRST_CONTROL = """() => Array.from(document.querySelectorAll(
    '.cell_output .widget-slider .noUi-handle, .cell_output .widget-dropdown select'))
    .some(e => e.getClientRects().length)"""


def widget_pages(book: Path) -> list[str]:
    """Pages of the book (relative paths) whose HTML embeds widget state."""
    marker = "application/vnd.jupyter.widget-state+json"
    return sorted(str(p.relative_to(book)) for p in (book / "chapters").glob("*.html")
                  if marker in p.read_text(encoding="utf-8"))


def serve(book: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A local server of ``book`` on 127.0.0.1 and its address."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(book)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def load_times(browser, url: str, throttle: float) -> dict[str, float]:
    """One load of ``url`` in a fresh context: ms from navigation start to the first picture
    and to the first control."""
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    context.route("**/*", lambda route: route.abort() if not route.request.url.startswith(
        ("http://127.0.0.1", "data:", "blob:")) else route.continue_())
    page = context.new_page()
    if throttle != 1:
        page.context.new_cdp_session(page).send(
            "Emulation.setCPUThrottlingRate", {"rate": throttle})
    page.goto(url, wait_until="commit")
    found = {}
    for name, probe in (("picture", FIRST_PICTURE), ("control", FIRST_CONTROL)):
        page.wait_for_function(probe, polling="raf", timeout=60_000)
        found[name] = page.evaluate("() => performance.now()")
    context.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("book", nargs="?", default=str(ROOT / "_build" / "html"))
    parser.add_argument("--loads", type=int, default=5)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    book = Path(args.book)
    httpd, base = serve(book)
    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"))
        for page in widget_pages(book):
            row = [page]
            for throttle in (1, 4):
                loads = [load_times(browser, f"{base}/{page}", throttle)
                         for _ in range(args.loads)]
                row += [statistics.median(t[k] for t in loads) for k in ("picture", "control")]
            rows.append(row)
            print(f"| {row[0]} | " + " | ".join(f"{v:,.0f}" for v in row[1:]) + " |", flush=True)
        browser.close()
    httpd.shutdown()
    print("\n| page | picture | control | picture, CPU 4× | control, CPU 4× |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row[0]} | " + " | ".join(f"{v:,.0f}" for v in row[1:]) + " |")
    medians = [statistics.median(r[i] for r in rows) for i in range(1, 5)]
    print("| median of pages | " + " | ".join(f"{v:,.0f}" for v in medians) + " |")


if __name__ == "__main__":
    main()
