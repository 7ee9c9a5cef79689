/* The book's own script, loaded on every page (html_js_files in _config.yml). Small fixes
   to what the theme and the widgets draw; each does nothing where it finds nothing.

   1. Scroll cue: a display formula, a table or a code block wider than its column scrolls
      in its own box (book.css); while more of it lies to the right (left), the box gets the
      class scroll-more-right (scroll-more-left), and book.css fades that edge out.
   2. Search snippets: Sphinx's search shows a few lines of each page found, taken from the
      page's HTML, where math is still TeX source ("\(QK^\top\)"). Formulas are left out of
      the snippet ("…").
   3. Slider handles get an accessible name (the slider's label) and announce the value the
      readout shows (aria-valuetext; the widgets' own is the index of the chosen option);
      the readouts, which the widget manager makes editable, are shown text only (typing in
      one changed the number and not the picture); widget labels lose the tooltip "null"
      that the widget manager writes when a widget has no tooltip.
   4. The theme's drawers on a phone (the table of contents, the page's sections) close when
      a link in them is chosen, so the reader sees the section the link went to.
   5. The notation's table, stacked into blocks on a phone, names each cell by its column;
      the table of contents' folds are named after their chapters; an explorer's picture
      takes its caption as alt text, and a widget box that scrolls is focusable.
   6. Folded answers: each self-check answer's bar is numbered after its question ("Answer
      1"), and every fold's button is named by its bar, not "Toggle hidden content".
   7. Code lines: each line of a code block's source (not of printed output) becomes a span
      of its own, its indentation recorded, so that on a phone (book.css) a long line wraps
      under itself with a hanging indent instead of running out of the box, and the shape
      comment at its end is seen. The text is unchanged (the copy button copies it as is).
*/
(function () {
  "use strict";

  const SCROLL_BOXES = [
    "div.math mjx-container",
    "span.math.math-scrolls",
    ".pst-scrollable-table-container",
    ".cell_output .output.text_html",
    "div.highlight pre",
    ".cell_output .output.text_html > div",
    ".cell_output .widget-box",
  ].join(",");
  // px: a formula may stick out of its box by the slant of an italic letter; that is no
  // hidden content, and fading it would only grey out the letter.
  const SLACK = 4;

  // The code a reader reads (cells' source, code in the text), not printed output, whose
  // columns line up and must not wrap.
  const CODE_SOURCES = [
    "div.cell_input div.highlight > pre",
    "div[class*='highlight-python'] div.highlight > pre",
    "div.highlight-ipython3 div.highlight > pre",
  ].join(",");

  const FOCUSABLE = "a[href], button, input, select, textarea, [tabindex]:not([tabindex='-1'])";

  function markScroll(box) {
    const hidden = box.scrollWidth - box.clientWidth;
    const scrolls = hidden > SLACK;
    box.classList.toggle("scroll-more-left", scrolls && box.scrollLeft > 1);
    box.classList.toggle("scroll-more-right", scrolls && hidden - box.scrollLeft > 1);
    // A box that scrolls, if only by a pixel, is a tab stop, so a keyboard can scroll it
    // (formulas are not tab stops otherwise), unless something in it already is one.
    const style = (hidden > 0 || box.scrollHeight > box.clientHeight) && getComputedStyle(box);
    const scrollable = style && (/(auto|scroll)/.test(style.overflowX) && hidden > 0
      || /(auto|scroll)/.test(style.overflowY) && box.scrollHeight > box.clientHeight);
    if (scrollable && !box.hasAttribute("tabindex") && !box.querySelector(FOCUSABLE)) {
      box.tabIndex = 0;
      box.dataset.scrollStop = "";
    } else if (!scrollable && "scrollStop" in box.dataset) {
      box.removeAttribute("tabindex");
      delete box.dataset.scrollStop;
    }
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

  // The readouts are contenteditable in the widget manager: typing in one changes the text
  // and not the widget. Here they are text, and each handle announces what its readout shows.
  function describeSliders(root) {
    root.querySelectorAll(".widget-slider").forEach((slider) => {
      const readout = slider.querySelector(".widget-readout");
      const handle = slider.querySelector(".noUi-handle");
      if (!readout) return;
      if (readout.isContentEditable) {
        readout.contentEditable = "false";
        readout.tabIndex = -1;
      }
      const shown = readout.textContent.trim();
      if (handle && shown && handle.getAttribute("aria-valuetext") !== shown) {
        handle.setAttribute("aria-valuetext", shown);
      }
    });
  }

  // An explorer's picture is described by the caption line the explorer writes under it
  // (what the frame shows, updated with every move): that text becomes the picture's alt,
  // and the caption is announced when it changes.
  function describePictures(root) {
    root.querySelectorAll(".cell_output .widget-image").forEach((image) => {
      const explorer = image.closest(".cell_output");
      const captions = explorer ? Array.from(explorer.querySelectorAll(".widget-html")) : [];
      const caption = captions.find((c) => c.compareDocumentPosition(image)
        & Node.DOCUMENT_POSITION_PRECEDING) || captions[0];
      const text = caption ? caption.textContent.replace(/\s+/g, " ").trim() : "";
      const alt = text || "explorer picture";
      if (image.getAttribute("alt") !== alt) image.setAttribute("alt", alt);
      if (caption && !caption.hasAttribute("aria-live")) caption.setAttribute("aria-live", "polite");
    });
  }

  function setUpWidgets() {
    nameSliderHandles(document);
    describeSliders(document);
    describePictures(document);
    // The widget manager draws the widgets after the page has loaded.
    let pending = 0;
    new MutationObserver(() => {
      cancelAnimationFrame(pending);
      pending = requestAnimationFrame(() => {
        nameSliderHandles(document);
        describeSliders(document);
        describePictures(document);
        markAllScrolls();
      });
    }).observe(document.body, { childList: true, subtree: true, characterData: true });
  }

  // A table stacked into blocks on a phone (book.css, table.notation) names each cell by its
  // column's header.
  function labelStackedCells() {
    document.querySelectorAll("table.notation").forEach((table) => {
      const heads = Array.from(table.querySelectorAll("thead th")).map(
        (th) => th.textContent.trim());
      table.querySelectorAll("tbody tr").forEach((row) => {
        Array.from(row.children).forEach((cell, i) => {
          if (heads[i]) cell.dataset.label = heads[i];
          cell.classList.toggle("empty-cell", !cell.textContent.trim());
        });
      });
    });
  }

  // The table of contents folds a chapter's pages under a bare chevron (<summary> with an
  // icon only): each is named after the chapter it opens.
  function nameTocFolds() {
    document.querySelectorAll(".bd-sidenav details > summary").forEach((summary) => {
      if (summary.getAttribute("aria-label")) return;
      const link = summary.parentElement.parentElement.querySelector(":scope > a");
      const name = link && link.textContent.replace(/\s+/g, " ").trim();
      if (name) summary.setAttribute("aria-label", name);
    });
  }

  function closeDrawersOnFollow() {
    document.addEventListener("click", (event) => {
      const link = event.target instanceof Element && event.target.closest("dialog a[href]");
      const drawer = link && link.closest("dialog");
      if (drawer && drawer.open) drawer.close();
    });
  }

  // sphinx-togglebutton adds its buttons when the page has loaded.
  function nameFolds() {
    let question = 0;
    document.querySelectorAll(".admonition.dropdown").forEach((fold) => {
      const title = fold.querySelector(":scope > .admonition-title");
      if (!title) return;
      let asked = fold.previousElementSibling;
      // A self-check question may be a quiz (_ext/quiz.py): its question's first paragraph.
      if (asked && asked.matches("form.quiz")) asked = asked.querySelector(".quiz-question > p");
      const number = asked && asked.matches("p") && asked.firstElementChild &&
        asked.firstElementChild.matches("strong") &&
        /^(\d+)\.$/.exec(asked.firstElementChild.textContent.trim());
      if (!fold.classList.contains("solution") && number && !title.dataset.numbered) {
        question = number[1];
        const text = Array.from(title.childNodes).find(
          (n) => n.nodeType === Node.TEXT_NODE && n.textContent.trim());
        if (text) text.textContent = `${text.textContent.trim()} ${question}`;
        title.dataset.numbered = question;
      }
      const button = title.querySelector("button.toggle-button");
      const name = Array.from(title.childNodes).filter((n) => n !== button)
        .map((n) => n.textContent).join("").replace(/\s+/g, " ").trim();
      if (button && name) button.setAttribute("aria-label", name);
    });
  }

  // Pygments writes a code block as a flat run of token spans and text, newlines inside
  // them. The run is cut at each newline into lines: <span class="code-line"> per line, its
  // tokens (a token across a newline split in two copies), the newline kept at its end.
  function splitCodeLines(pre) {
    const lines = [];
    let line = document.createElement("span");
    const finish = () => {
      const text = line.textContent;
      const indent = text.length - text.replace(/^ +/, "").length;
      line.className = "code-line";
      line.style.setProperty("--indent", `${indent}ch`);
      lines.push(line);
      line = document.createElement("span");
    };
    Array.from(pre.childNodes).forEach((node) => {
      const parts = node.textContent.split("\n");
      parts.forEach((part, i) => {
        if (part) {
          const piece = node.nodeType === Node.ELEMENT_NODE ? node.cloneNode(false)
            : document.createTextNode("");
          piece.textContent = part;
          line.appendChild(piece);
        }
        if (i < parts.length - 1) {
          line.appendChild(document.createTextNode("\n"));
          finish();
        }
      });
    });
    if (line.childNodes.length) finish();
    pre.replaceChildren(...lines);
    pre.classList.add("code-lines");
  }

  function wrapCodeLines() {
    document.querySelectorAll(CODE_SOURCES).forEach((pre) => {
      if (!pre.classList.contains("code-lines")) splitCodeLines(pre);
    });
  }

  function start() {
    wrapCodeLines();
    setUpScrollCues();
    leaveMathOutOfSearchSnippets();
    closeDrawersOnFollow();
    labelStackedCells();
    nameTocFolds();
    if (document.readyState === "complete") nameFolds();
    else window.addEventListener("load", nameFolds);
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
