"""The self-check quizzes in Chromium (_ext/quiz.py, _assets/quiz.js): on one page of each
edition, by keyboard only, a wrong choice gets the feedback of its misconception, the right
one "correct", a foreseen wrong number its own feedback and the key a right number; the
buttons speak the edition's language."""
from __future__ import annotations

import pytest
import test_browser as english

server = english.server  # the English tests' fixtures: one local server, one Chromium
browser = english.browser

pytestmark = [pytest.mark.browser, pytest.mark.book]

PAGE = "chapters/02_qkv_roles.html"
# The edition's folder -> its words for "Check", "Not quite." and "Correct." (quiz.po).
EDITIONS = {"": ("Check", "Not quite.", "Correct."), "zh/": ("检查", "不太对。", "正确。")}

_SHOWN = """form => ({verdict: form.querySelector('.quiz-verdict').textContent,
    shown: Array.from(form.querySelectorAll('.quiz-explain')).filter(e => !e.hidden)
        .map(e => ({choice: e.dataset.choice, text: e.textContent.trim()})),
    right: form.classList.contains('quiz-right')})"""


def _check_by_keyboard(page) -> None:
    """From the focused control, Tab on to the quiz's Check button and press it."""
    for _ in range(6):
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement.classList.contains('quiz-check')"):
            page.keyboard.press("Enter")
            page.wait_for_timeout(100)
            return
    raise AssertionError("Tab did not reach the Check button")


@pytest.mark.parametrize("folder", list(EDITIONS))
def test_a_quiz_answers_back_by_keyboard(server, browser, folder):
    check, wrong, correct = EDITIONS[folder]
    page, problems = browser.open(f"{server}/{folder}{PAGE}")
    try:
        choice = page.locator("form.quiz-choice").first
        assert choice.locator(".quiz-check").inner_text() == check
        choice.locator("input[type=radio]").first.focus()
        page.keyboard.press("Space")  # choice 1: a wrong one
        _check_by_keyboard(page)
        state = choice.evaluate(_SHOWN)
        assert state["verdict"] == wrong and not state["right"], state
        assert [s["choice"] for s in state["shown"]] == ["1"] and state["shown"][0]["text"]
        choice.locator("input[type=radio]").first.focus()
        page.keyboard.press("ArrowDown")  # choice 2, the right one
        _check_by_keyboard(page)
        state = choice.evaluate(_SHOWN)
        assert state["verdict"] == correct and state["right"], state
        assert [s["choice"] for s in state["shown"]] == [choice.get_attribute("data-answer")]

        number = page.locator("form.quiz-number").first
        field = number.locator("input[type=text]")
        foreseen = number.locator(".quiz-explain").first.get_attribute("data-value")
        field.focus()
        page.keyboard.type(str(int(float(foreseen))))
        page.keyboard.press("Enter")  # Enter in the field submits the form
        page.wait_for_timeout(100)
        state = number.evaluate(_SHOWN)
        assert state["verdict"].startswith(wrong) and len(state["shown"]) == 1, state
        key = number.get_attribute("data-shown")
        field.fill("")
        field.focus()
        page.keyboard.type(key)
        page.keyboard.press("Enter")
        page.wait_for_timeout(100)
        state = number.evaluate(_SHOWN)
        assert state["right"] and state["verdict"].startswith(correct) and key in state["verdict"]
        typed = page.evaluate("""() => ['1,024', '1 024', '0,5', '−3', '2.5', '', 'one', '0,488']
            .map(t => window.quizNumber(t))""")
        assert typed == [1024, 1024, 0.5, -3, 2.5, None, None, 0.488], typed
        assert not problems, "\n".join(problems)
    finally:
        page.close()
