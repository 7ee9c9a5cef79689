"""Search for a language whose script is written without spaces, without a word list.

Loaded by every edition; it acts in an edition whose entry of ``book_languages`` says
``search: bigram`` (with its ``script``). Sphinx's own search for such a language needs a word
segmenter (for Chinese, ``jieba``, about 42 MB); without it a page's text in the script is not
in the search index at all. This search indexes every run of the script's letters as its
single characters and its overlapping pairs of characters (bigrams), and cuts a query the same
way in the browser. Sphinx's search returns the pages that hold every term of a query, so a
query of any length finds the pages where all its pairs occur, which is nearly always where
the query itself occurs; nothing needs a dictionary, and a new term of the course is found as
soon as it is written. Latin words are indexed as Sphinx's Chinese search indexes them
(stemmed as English).
"""
from __future__ import annotations

import re
from typing import Any

from i18n_editions import edition_of
from sphinx.application import Sphinx
from sphinx.search.zh import SearchChinese

# The letters of each script a language entry may name (``script:``): a character class for
# Python, and the Unicode script property the browser's query splitter uses. tools/i18n's
# languages.LETTERS is the same table (tests/test_i18n.py checks it).
SCRIPT_LETTERS = {"cjk": "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"}
SCRIPT_PROPERTY = {"cjk": r"\p{Script=Han}"}

# The browser side: a query cut the way split() cuts the text (a lone character alone, a
# longer run into its pairs); Latin words as Sphinx cuts them. SCRIPT is the script's
# Unicode property.
_SPLITTER = r"""
function splitQuery(query) {
  const terms = [];
  for (const part of query.split(/[^\p{Letter}\p{Number}_]+/gu)) {
    for (const run of part.match(/SCRIPT+|[^SCRIPT]+/gu) || []) {
      if (!/SCRIPT/u.test(run)) { terms.push(run); continue; }
      if (run.length === 1) terms.push(run);
      for (let i = 0; i + 1 < run.length; i++) terms.push(run.slice(i, i + 2));
    }
  }
  return terms;
}
"""


def script_terms(text: str, script: str) -> list[str]:
    """The index terms of the text in ``script``: each character, and each pair of
    neighbouring characters within a run.

    Args:
        text: any text.
        script: a key of ``SCRIPT_LETTERS``.

    Returns:
        The terms, in the order they occur.
    """
    terms: list[str] = []
    for run in re.findall(f"[{SCRIPT_LETTERS[script]}]+", text):
        terms.extend(run)
        terms.extend(run[i:i + 2] for i in range(len(run) - 1))
    return terms


def bigram_search(code: str, script: str) -> type[SearchChinese]:
    """Sphinx's search language for ``code``: characters and bigrams of ``script`` in place of
    a segmenter's words, Latin words as Sphinx's Chinese search takes them.

    Raises:
        ValueError: if ``script`` is not one of ``SCRIPT_LETTERS``.
    """
    if script not in SCRIPT_LETTERS:
        raise ValueError(f"search: bigram needs a script of {sorted(SCRIPT_LETTERS)}, "
                         f"got {script!r} for {code!r}")
    letters = re.compile(f"[{SCRIPT_LETTERS[script]}]+")

    class SearchBigrams(SearchChinese):
        lang = code
        js_splitter_code = _SPLITTER.replace("SCRIPT", SCRIPT_PROPERTY[script])

        def init(self, options: dict) -> None:
            super().init(options)
            self.latin_words: set[str] = set()  # Sphinx keeps a list: a lookup per word, O(n²)

        def split(self, input: str) -> list[str]:
            latin = [term.strip() for term in self.latin1_letters.findall(input)]
            self.latin_words.update(latin)
            return script_terms(input, script) + latin

        def stem(self, word: str) -> str:
            """Sphinx's Chinese stemming of a Latin word (a word of 3 letters or more that
            stemming would cut below 3 stays whole), looked up in a set."""
            lowered = word.lower()
            stemmed = self.stemmer.stemWord(lowered)
            if word in self.latin_words and len(word) >= 3 and len(stemmed) < 3:
                return lowered
            return stemmed

        def word_filter(self, stemmed_word: str) -> bool:
            return len(stemmed_word) > 1 or bool(letters.fullmatch(stemmed_word))

    SearchBigrams.__name__ = SearchBigrams.__qualname__ = f"SearchBigrams_{code}"
    return SearchBigrams


def _register(app: Sphinx, config: Any) -> None:
    entry, translated = edition_of(config)
    if translated and entry.get("search") == "bigram":
        app.add_search_language(bigram_search(config.language, entry.get("script", "")))


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("i18n_editions")  # the list of languages
    app.connect("config-inited", _register)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
