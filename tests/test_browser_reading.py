"""What a reader meets in the built book, each item found broken by a reader once: explorer
readouts that looked editable and were announced as an index, the contents drawer that stayed
open after a tap, formulas as tab stops, solution bars whose title followed its link instead
of opening, the language link as two empty boxes, the notation table squeezed on a phone,
self-check answers all called "Answer", code boxes with no sign that they scroll, and explorers
that were blank until 3.6 MB of script had run.

Runs on the built book with the browser of ``test_browser.py`` (its fixtures and helpers).
"""
from __future__ import annotations

import pytest
import test_browser as english
from test_browser import (
    PHONE,
    PLACEHOLDERS,
    _centre,
    _drawer_open,
    _only_visible,
    _phone,
    _tap,
    _wait_for_widgets,
)

server = english.server  # the English tests' fixtures: one local server, one Chromium
browser = english.browser

pytestmark = [pytest.mark.browser, pytest.mark.book]


def test_readouts_are_text_and_handles_announce_the_value_shown(server, browser):
    """Chapter 1's explorer: no readout can be edited or tabbed to, and each handle's
    aria-valuetext is its readout's text, also after a key moves it."""
    page, problems = browser.open(f"{server}/chapters/01_attention.html")
    try:
        _wait_for_widgets(page)
        page.wait_for_timeout(300)
        state = """() => Array.from(document.querySelectorAll('.widget-slider'))
            .filter(s => s.getClientRects().length).map(s => ({
                editable: s.querySelector('.widget-readout').isContentEditable,
                tab: s.querySelector('.widget-readout').tabIndex,
                shown: s.querySelector('.widget-readout').textContent.trim(),
                said: s.querySelector('.noUi-handle').getAttribute('aria-valuetext')}))"""
        before = page.evaluate(state)
        assert before and not any(s["editable"] for s in before), before
        assert all(s["tab"] == -1 and s["said"] == s["shown"] for s in before), before
        page.locator(".widget-slider .noUi-handle >> visible=true").first.focus()
        page.keyboard.press("ArrowRight")
        page.wait_for_timeout(600)
        after = page.evaluate(state)
        assert after[0]["shown"] != before[0]["shown"], "the key did not move the slider"
        assert after[0]["said"] == after[0]["shown"], after[0]
        assert not problems, "\n".join(problems)
    finally:
        page.close()


def test_the_contents_drawer_closes_when_a_section_is_chosen(server, browser):
    """On a phone, a tap on a section in the "contents" drawer goes there and closes it."""
    page, problems = browser.open(f"{server}/chapters/05_positional.html")
    try:
        cdp = _phone(page)
        _tap(cdp, *_centre(_only_visible(page, ".secondary-toggle")))
        page.wait_for_timeout(300)
        assert _drawer_open(page, "secondary")
        link = page.locator("#pst-secondary-sidebar-modal a[href^='#'] >> visible=true").nth(2)
        target = link.get_attribute("href")
        _tap(cdp, *_centre(link))
        page.wait_for_timeout(500)
        assert not _drawer_open(page, "secondary"), "the drawer stayed open over the page"
        assert page.evaluate("() => location.hash") == target
        assert not problems, "\n".join(problems)
    finally:
        page.close()


def test_formulas_are_not_tab_stops(server, browser):
    """Tab goes from control to control, not through every formula (chapter 1 has hundreds)."""
    page, problems = browser.open(f"{server}/chapters/01_attention.html")
    try:
        page.wait_for_function("() => window.MathJax && MathJax.startup && "
                               "document.querySelectorAll('mjx-container').length > 50")
        page.evaluate("() => MathJax.startup.promise")
        focusable = page.evaluate("""() => Array.from(document.querySelectorAll(
            'mjx-container')).filter(m => m.tabIndex >= 0).length""")
        assert focusable == 0, f"{focusable} formulas are tab stops"
        assert not problems, "\n".join(problems)
    finally:
        page.close()


def test_a_tap_on_a_solution_bar_opens_the_solution(server, browser):
    """On a phone a solution's bar is mostly its title, a link to the exercise: a tap on the
    title opens the solution and stays where it is."""
    page, problems = browser.open(f"{server}/chapters/01_attention.html")
    try:
        cdp = _phone(page)
        page.wait_for_timeout(300)
        solution = page.locator(".solution.dropdown").first
        title_link = solution.locator(".admonition-title a").first
        title_link.scroll_into_view_if_needed()
        page.wait_for_timeout(200)
        assert "toggle-hidden" in solution.get_attribute("class")
        _tap(cdp, *_centre(title_link))
        page.wait_for_timeout(500)
        assert "toggle-hidden" not in solution.get_attribute("class"), "the solution stayed shut"
        assert page.evaluate("() => location.hash") == "", "the tap followed the link"
        assert not problems, "\n".join(problems)
    finally:
        page.close()


def test_the_language_link_is_drawn_and_easy_to_touch(server, browser):
    """"中文" on an English page is drawn with the book's shipped font (no empty boxes on a
    machine without a Chinese font) and is a target of at least 24 × 24 px on a phone."""
    page, problems = browser.open(f"{server}/intro.html")
    try:
        _phone(page)
        link = page.locator(".edition-switch a").first
        box = link.bounding_box()
        assert box["width"] >= 24 and box["height"] >= 24, box
        page.evaluate("() => document.fonts.ready")
        drawn = page.evaluate("""() => {
            const a = document.querySelector('.edition-switch a');
            const family = getComputedStyle(a).fontFamily;
            return {family, loaded: document.fonts.check('16px "Glossary Noto Sans SC"', a.textContent)};
        }""")
        assert drawn["family"].startswith('"Glossary Noto Sans SC"'), drawn
        assert drawn["loaded"], drawn
        assert not problems, "\n".join(problems)
    finally:
        page.close()


def test_the_notation_table_is_read_in_blocks_on_a_phone(server, browser):
    """At 390 px each shape letter is a block: no cell is squeezed below a third of the screen,
    and each cell after the letter says which column it is."""
    page, problems = browser.open(f"{server}/appendix/notation.html")
    try:
        _phone(page)
        cells = page.evaluate("""() => Array.from(document.querySelectorAll(
                'table.notation tbody td')).filter(td => td.getClientRects().length)
            .map(td => ({width: td.getBoundingClientRect().width, label: td.dataset.label,
                         first: !td.previousElementSibling}))""")
        assert len(cells) >= 8
        narrow = [c for c in cells if c["width"] < PHONE["width"] / 3]
        assert not narrow, f"squeezed cells: {narrow[:3]}"
        assert all(c["label"] for c in cells if not c["first"])
        assert not problems, "\n".join(problems)
    finally:
        page.close()


def test_self_check_answers_are_numbered_and_named(server, browser):
    """Chapter 1's answers read "Answer 1", "Answer 2", … and each fold's button is named by
    its bar, not "Toggle hidden content"."""
    page, problems = browser.open(f"{server}/chapters/01_attention.html")
    try:
        page.wait_for_load_state("load")
        page.wait_for_timeout(300)
        folds = page.evaluate("""() => Array.from(document.querySelectorAll(
                '.admonition.dropdown > .admonition-title')).map(t => ({
                    text: t.textContent.trim(),
                    name: (t.querySelector('button.toggle-button') || {getAttribute: () => ''})
                        .getAttribute('aria-label')}))""")
        answers = [f["text"] for f in folds if f["text"].startswith("Answer")]
        assert answers == [f"Answer {n}" for n in range(1, len(answers) + 1)] and answers
        assert not [f for f in folds if f["name"] in ("", "Toggle hidden content")], folds
        assert not problems, "\n".join(problems)
    finally:
        page.close()


def test_a_code_box_wider_than_a_phone_shows_that_it_scrolls(server, browser):
    """On a phone a code cell wider than the screen fades out at its right edge, as formulas
    and tables do."""
    page, problems = browser.open(f"{server}/chapters/01_attention.html")
    try:
        _phone(page)
        page.wait_for_timeout(500)
        found = page.evaluate("""() => Array.from(document.querySelectorAll('div.highlight pre'))
            .filter(p => p.getClientRects().length && p.scrollWidth - p.clientWidth > 8)
            .map(p => p.classList.contains('scroll-more-right'))""")
        assert found and all(found), f"{found.count(False)} of {len(found)} wide code boxes unmarked"
        mask = page.evaluate("""() => getComputedStyle(
            document.querySelector('div.highlight pre.scroll-more-right')).maskImage""")
        assert mask.startswith("linear-gradient"), mask
        assert not problems, "\n".join(problems)
    finally:
        page.close()


def test_an_explorer_shows_its_first_picture_before_its_scripts_run(server, browser):
    """The widget scripts are deferred, and until they have drawn the explorers (here: never,
    their manager is not served) each explorer's place shows its first frame, loaded and
    described, as wide as the column allows: the wide frame on a desktop, the narrow one on
    a phone, as the live explorer would."""
    page = browser.context.new_page()
    page.route("**/embed-amd.js*", lambda route: route.abort())
    try:
        page.goto(f"{server}/chapters/01_attention.html", wait_until="load")
        deferred = page.evaluate("""() => Array.from(document.querySelectorAll('script[src]'))
            .filter(s => /widgets\\//.test(s.src)).map(s => s.defer)""")
        assert deferred == [True, True, True], deferred
        for size, frames in (({"width": 1366, "height": 900}, "explorer-wide"),
                             (PHONE, "explorer-narrow")):
            width = size["width"]
            page.set_viewport_size(size)
            page.wait_for_timeout(200)
            stand_ins = page.evaluate(PLACEHOLDERS)
            assert stand_ins and all(p["found"] and p["shown"] and p["described"]
                                     and p["loaded"] and p["set"] == frames
                                     for p in stand_ins), (width, stand_ins)
            shown, column = page.evaluate("""() => {
                const img = Array.from(document.querySelectorAll('.explorer-placeholder img'))
                    .find(i => i.getClientRects().length);
                return [img.getBoundingClientRect().width,
                        img.closest('.cell_output').getBoundingClientRect().width]; }""")
            assert 0.5 * column <= shown <= column + 1, (width, shown, column)
    finally:
        page.close()
