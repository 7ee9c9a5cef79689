/* The book's own script, loaded on every page (html_js_files in _config.yml). Three small
   fixes to what the theme and the widgets draw; each does nothing where it finds nothing.

   1. Scroll cue: a display formula or a table wider than its column scrolls in its own box
      (book.css); while more of it lies to the right (left), the box gets the class
      scroll-more-right (scroll-more-left), and book.css fades that edge out.
   2. Search snippets: Sphinx's search shows a few lines of each page found, taken from the
      page's HTML, where math is still TeX source ("\(QK^\top\)"). Formulas are left out of
      the snippet ("…").
   3. Slider handles get an accessible name (the slider's label), and widget labels lose
      the tooltip "null" that the widget manager writes when a widget has no tooltip.
*/
(function () {
  "use strict";

  const SCROLL_BOXES = [
    "div.math mjx-container",
    "span.math.math-scrolls",
    ".pst-scrollable-table-container",
    ".cell_output .output.text_html",
  ].join(",");
  // px: a formula may stick out of its box by the slant of an italic letter; that is no
  // hidden content, and fading it would only grey out the letter.
  const SLACK = 4;

  function markScroll(box) {
    const hidden = box.scrollWidth - box.clientWidth;
    const scrolls = hidden > SLACK;
    box.classList.toggle("scroll-more-left", scrolls && box.scrollLeft > 1);
    box.classList.toggle("scroll-more-right", scrolls && hidden - box.scrollLeft > 1);
  }

  // An inline formula longer than its line (long ones belong in display math, but one may
  // slip through) scrolls in its own box rather than running out of the column.
  function markLongInlineMath() {
    document.querySelectorAll("span.math").forEach((span) => {
      const math = span.querySelector("mjx-container");
      if (!math) return;
      const tooLong = math.getBoundingClientRect().width - span.clientWidth > SLACK;
      if (tooLong !== span.classList.contains("math-scrolls")) {
        span.classList.toggle("math-scrolls", tooLong);
      }
    });
  }

  function markAllScrolls() {
    markLongInlineMath();
    document.querySelectorAll(SCROLL_BOXES).forEach(markScroll);
  }

  function setUpScrollCues() {
    document.addEventListener("scroll", (event) => {
      const box = event.target;
      if (box instanceof Element && box.matches(SCROLL_BOXES)) markScroll(box);
    }, { capture: true, passive: true });
    let pending = 0;
    window.addEventListener("resize", () => {
      cancelAnimationFrame(pending);
      pending = requestAnimationFrame(markAllScrolls);
    });
    markAllScrolls();
    // Formulas have their width only once MathJax has typeset them.
    const mathjax = window.MathJax && window.MathJax.startup && window.MathJax.startup.promise;
    if (mathjax) mathjax.then(markAllScrolls);
    window.addEventListener("load", () => {
      const later = window.MathJax && window.MathJax.startup && window.MathJax.startup.promise;
      (later || Promise.resolve()).then(markAllScrolls);
    });
  }

  function leaveMathOutOfSearchSnippets() {
    // searchtools.js declares `const Search`: a global name, but not a property of window.
    const search = typeof Search === "undefined" ? null : Search;  // eslint-disable-line no-undef
    if (!search || typeof search.htmlToText !== "function" || search.bookMathless) return;
    const original = search.htmlToText;
    search.htmlToText = (htmlString, anchor) => {
      const page = new DOMParser().parseFromString(htmlString, "text/html");
      page.querySelectorAll(".math").forEach(
        (m) => m.replaceWith(m.tagName === "DIV" ? " … " : "…"));
      return original(page.documentElement.outerHTML, anchor);
    };
    search.bookMathless = true;
  }

  function nameSliderHandles(root) {
    root.querySelectorAll(".jupyter-widgets [title='null']").forEach(
      (e) => e.removeAttribute("title"));
    root.querySelectorAll(".widget-slider .noUi-handle:not([aria-label])").forEach((handle) => {
      const slider = handle.closest(".widget-slider");
      const label = slider && slider.querySelector(".widget-label");
      const name = label && label.textContent.trim();
      if (name) handle.setAttribute("aria-label", name);
    });
  }

  function setUpWidgets() {
    nameSliderHandles(document);
    // The widget manager draws the widgets after the page has loaded.
    let pending = 0;
    new MutationObserver(() => {
      cancelAnimationFrame(pending);
      pending = requestAnimationFrame(() => {
        nameSliderHandles(document);
        markAllScrolls();
      });
    }).observe(document.body, { childList: true, subtree: true });
  }

  function start() {
    setUpScrollCues();
    leaveMathOutOfSearchSnippets();
    if (document.querySelector('script[type="application/vnd.jupyter.widget-state+json"]')) {
      setUpWidgets();
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
