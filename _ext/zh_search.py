"""Search that finds Chinese words in the Chinese edition, without a word list.

Sphinx's Chinese search indexes Chinese text only through ``jieba``, a word segmenter of
about 42 MB; without it a Chinese page's text is not in the search index at all. This
extension, loaded by the Chinese edition's config (tools/zh_config.py), indexes every run of
Chinese characters as its single characters and its overlapping pairs of characters
(bigrams), and cuts a query the same way in the browser. Sphinx's search returns the pages
that hold every term of a query, so a query of any length finds the pages where all its
pairs occur, which is nearly always where the query itself occurs; nothing needs a
dictionary, and a new term of the course is found as soon as it is written. Latin words are
indexed as Sphinx's Chinese search indexes them (stemmed as English).
"""
from __future__ import annotations

import re
from typing import Any

from sphinx.application import Sphinx
from sphinx.search.zh import SearchChinese

HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")


def han_terms(text: str) -> list[str]:
    """The index terms of the Chinese text in ``text``: each character, and each pair of
    neighbouring characters within a run.

    Args:
        text: any text.

    Returns:
        The terms, in the order they occur.
    """
    terms: list[str] = []
    for run in HAN.findall(text):
        terms.extend(run)
        terms.extend(run[i:i + 2] for i in range(len(run) - 1))
    return terms


class SearchChineseBigrams(SearchChinese):
    """Sphinx's Chinese search with characters and bigrams in place of jieba's words."""

    # The browser side: a query cut the way split() cuts the text (a lone character alone,
    # a longer run into its pairs); Latin words as Sphinx cuts them.
    js_splitter_code = r"""
function splitQuery(query) {
  const terms = [];
  for (const part of query.split(/[^\p{Letter}\p{Number}_]+/gu)) {
    for (const run of part.match(/\p{Script=Han}+|[^\p{Script=Han}]+/gu) || []) {
      if (!/\p{Script=Han}/u.test(run)) { terms.push(run); continue; }
      if (run.length === 1) terms.push(run);
      for (let i = 0; i + 1 < run.length; i++) terms.push(run.slice(i, i + 2));
    }
  }
  return terms;
}
"""

    def split(self, input: str) -> list[str]:
        latin = [term.strip() for term in self.latin1_letters.findall(input)]
        self.latin_terms.extend(latin)
        return han_terms(input) + latin

    def word_filter(self, stemmed_word: str) -> bool:
        return len(stemmed_word) > 1 or bool(HAN.fullmatch(stemmed_word))


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_search_language(SearchChineseBigrams)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
