// The self-check quizzes (_ext/quiz.py): check an answer in the page, without a kernel.
// A form.quiz holds the question, its radio buttons or number field, a Check and a "Show the
// answer" button, and a live region (.quiz-feedback) with one hidden .quiz-explain per
// foreseen answer. Its data-* attributes give the right answer (data-answer, or data-key,
// data-tolerance and data-shown) and the page's words for the messages (data-msg-*).
(function () {
  "use strict";

  // A typed number: "1,024" and "1 024" are 1024 (digits grouped by threes after a first
  // digit that is not 0), "0,5" is 0.5 (a decimal comma), "−3" is -3.
  function number(text) {
    let typed = String(text).trim().replace(/\u2212/g, "-").replace(/[\s\u00a0_']/g, "");
    if (/^[-+]?[1-9]\d{0,2}(,\d{3})+(\.\d+)?$/.test(typed)) {
      typed = typed.replace(/,/g, "");
    } else {
      typed = typed.replace(",", ".");
    }
    const value = Number(typed);
    return typed !== "" && Number.isFinite(value) ? value : null;
  }
  window.quizNumber = number;  // for the tests

  // Two messages in a row: a space between them, none after a full-width stop (Chinese).
  function both(first, second) {
    return first + (/[\u3002\uff01\uff1f\uff1a]$/.test(first) ? "" : " ") + second;
  }

  function setUp(form) {
    const data = form.dataset;
    const verdict = form.querySelector(".quiz-verdict");
    const explains = Array.from(form.querySelectorAll(".quiz-explain"));
    let wrongTries = 0;

    function say(text, state, explain) {
      explains.forEach(function (box) { box.hidden = box !== explain; });
      verdict.textContent = text;
      form.classList.remove("quiz-right", "quiz-wrong");
      if (state) form.classList.add("quiz-" + state);
    }

    function rightChoice() {
      return form.querySelector('input[type="radio"][value="' + data.answer + '"]');
    }

    function explainOf(index) {
      return explains.find(function (box) { return box.dataset.choice === String(index); });
    }

    function reveal() {
      let explain = null;
      if (data.kind === "choice") {
        rightChoice().checked = true;
        explain = explainOf(data.answer);
      }
      form.classList.add("quiz-revealed");
      const text = data.kind === "choice" ? data.msgMarked
        : data.msgAnswer.replace("{answer}", data.shown);
      say(text, "right", explain);
    }

    function check() {
      if (data.kind === "choice") {
        const chosen = form.querySelector('input[type="radio"]:checked');
        if (!chosen) return say(data.msgChoose, null, null);
        const right = chosen.value === data.answer;
        if (!right) wrongTries += 1;
        return say(right ? data.msgCorrect : data.msgWrong, right ? "right" : "wrong",
                   explainOf(chosen.value));
      }
      const field = form.querySelector('input[type="text"]');
      const value = number(field.value);
      if (value === null) return say(data.msgNan, null, null);
      if (Math.abs(value - Number(data.key)) <= Number(data.tolerance)) {
        return say(both(data.msgCorrect, data.msgAnswer.replace("{answer}", data.shown)),
                   "right", null);
      }
      wrongTries += 1;
      const foreseen = explains.find(function (box) {
        return Math.abs(value - Number(box.dataset.value)) <= Number(data.tolerance);
      });
      if (wrongTries >= 2) {  // the second wrong try shows the key
        form.classList.add("quiz-revealed");
        return say(both(data.msgWrong, data.msgAnswer.replace("{answer}", data.shown)),
                   "wrong", foreseen || null);
      }
      return say(foreseen ? data.msgWrong : data.msgAgain, "wrong", foreseen || null);
    }

    form.addEventListener("submit", function (event) {
      event.preventDefault();
      check();
    });
    form.querySelector(".quiz-show").addEventListener("click", reveal);
    form.addEventListener("change", function () {  // a new choice: the old verdict goes
      if (data.kind === "choice") say("", null, null);
    });
  }

  function start() {
    document.querySelectorAll("form.quiz").forEach(setUp);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
