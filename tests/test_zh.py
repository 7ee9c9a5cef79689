"""The Chinese edition: its generated config, its catalogs, and its built pages.

The catalogs (locales/zh_CN) must be in step with the English pages, and every page listed
in tools/zh_messages.py's COMPLETE translated throughout: no untranslated or fuzzy message, the
inline math of every translation the same as its English message's, display math never
translated. The built edition lies in _build/html/zh, one page for every English page.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po, write_po

import zh_config
import zh_messages
import zh_notebooks
from book_support import ROOT, config, ensure_built_book, toc_docnames

_HAN = re.compile(r"[\u4e00-\u9fff]")


# The generated configs ---------------------------------------------------------------------


def test_chinese_config_changes_only_language_locales_execution_and_address():
    english = config()
    chinese = zh_config.edition_config("zh")
    assert chinese["sphinx"]["config"]["language"] == "zh_CN"
    assert chinese["sphinx"]["config"]["locale_dirs"] == ["locales/"]
    assert chinese["sphinx"]["config"]["gettext_compact"] is False
    assert chinese["sphinx"]["recursive_update"] is True
    assert chinese["html"]["baseurl"] == english["html"]["baseurl"].rstrip("/") + "/zh/"
    # The launch buttons open the Chinese notebooks; no edit button.
    assert chinese["repository"] == {**english["repository"], "path_to_book": "zh"}
    assert chinese["html"]["use_edit_page_button"] is False
    assert chinese["title"] == "从零实现 Transformer"
    for key in english:  # everything else is the English config's
        if key not in ("sphinx", "html", "execute", "repository", "title"):
            assert chinese[key] == english[key], key
    assert chinese["sphinx"]["local_extensions"] == {  # absolute: see tools/zh_config.py
        **{name: str(ROOT / folder) for name, folder in english["sphinx"]["local_extensions"].items()},
        "zh_search": str(ROOT / "_ext"), "zh_widgets": str(ROOT / "_ext")}
    for key, value in english["sphinx"]["config"].items():
        assert chinese["sphinx"]["config"][key] == value, key
    assert config() == english  # the English config was not modified


def test_both_editions_share_one_execute_cache_and_extraction_executes_nothing():
    english, chinese = zh_config.edition_config("en"), zh_config.edition_config("zh")
    assert english["execute"]["execute_notebooks"] == "cache"
    assert english["execute"]["cache"] == chinese["execute"]["cache"] == str(zh_config.CACHE)
    assert english["execute"]["raise_on_error"] is chinese["execute"]["raise_on_error"] is True
    extraction = zh_config.edition_config("gettext")
    assert extraction["execute"]["execute_notebooks"] == "off"
    assert extraction["sphinx"]["config"]["gettext_compact"] is False  # one template a page
    with pytest.raises(ValueError, match="'fr'"):
        zh_config.edition_config("fr")


def test_written_config_reads_back(tmp_path: Path):
    import yaml

    out = zh_config.write("zh", tmp_path / "sub" / "zh.yml")
    assert yaml.safe_load(out.read_text(encoding="utf-8")) == zh_config.edition_config("zh")


# The catalog checks ------------------------------------------------------------------------


def _catalog(tmp_path: Path, monkeypatch, messages: list[tuple[str, str, bool]]) -> str:
    """A catalog ``page.po`` in ``tmp_path`` holding ``(english, chinese, fuzzy)`` messages."""
    catalog = Catalog(locale="zh_CN")
    for english, chinese, fuzzy in messages:
        catalog.add(english, chinese, flags=("fuzzy",) if fuzzy else ())
    with (tmp_path / "page.po").open("wb") as f:
        write_po(f, catalog)
    monkeypatch.setattr(zh_messages, "CATALOGS", tmp_path)
    return "page"


def test_a_finished_translation_has_no_problems(tmp_path, monkeypatch):
    page = _catalog(tmp_path, monkeypatch, [
        ("Softmax of $x$ and $y$.", "$y$ 与 $x$ 的 softmax。", False),
        ("$$\\sum_i x_i$$", "", False),  # display math left untranslated
        ("Scores {math}`QK^\\top`.", "分数 {math}`QK^\\top`。", False)])
    assert zh_messages.problems(page) == []


@pytest.mark.parametrize("english, chinese, fuzzy, problem", [
    ("The mask.", "", False, "untranslated"),
    ("The mask.", "掩码。", True, "fuzzy"),
    ("Scores $QK^\\top$.", "分数 $QK^T$。", False, "inline math"),
    ("Scores $QK^\\top$ and $V$.", "分数 $QK^\\top$。", False, "inline math"),
    ("$$\\sum_i x_i$$", "$$\\sum_i x_i$$ 求和", False, "display math"),
    ("\\begin{equation}a\\end{equation}", "公式", False, "display math"),
    ("\nX = E[t]\n", "\nX = E[词]\n", False, "display math"),
    ("**Read it online.** Every page.", "**在线阅读。**每一页。", False, "bold"),
    ("Use `view` here.", "这里用 view。", False, "code"),
    ("See the [notes](notation.md).", "见记号。", False, "links"),
])
def test_each_problem_is_found(tmp_path, monkeypatch, english, chinese, fuzzy, problem):
    page = _catalog(tmp_path, monkeypatch, [(english, chinese, fuzzy), ("Fine.", "好。", False)])
    found = zh_messages.problems(page)
    assert len(found) == 1 and problem in found[0], found


def test_a_missing_catalog_is_a_problem(tmp_path, monkeypatch):
    monkeypatch.setattr(zh_messages, "CATALOGS", tmp_path)
    assert "no catalog" in zh_messages.problems("chapters/99_none")[0]


def test_translated_pages_are_pages_of_the_book():
    assert set(zh_messages.COMPLETE) <= set(toc_docnames())


@pytest.mark.parametrize("page", zh_messages.COMPLETE)
def test_translated_page_is_complete(page):
    assert zh_messages.problems(page) == []


# The catalogs are in step with the English pages (extraction runs no notebook) -------------


@pytest.mark.book
def test_catalogs_hold_every_message_of_the_english_pages(tmp_path):
    templates = zh_messages.extract(tmp_path / "gettext")
    stale = []
    for page in toc_docnames():
        with (templates / f"{page}.pot").open("rb") as f:
            wanted = {m.id for m in read_po(f) if m.id}
        path = zh_messages.catalog(page)
        held = set()
        if path.exists():
            with path.open("rb") as f:
                held = {m.id for m in read_po(f) if m.id}
        if wanted - held:
            stale.append(f"{page}: {len(wanted - held)} messages not in its catalog")
    assert not stale, "run `make locales` and commit locales/:\n" + "\n".join(stale)


# The language switch -------------------------------------------------------------------------


def _extension(name: str):
    """The book's Sphinx extension ``_ext/<name>.py``, loaded as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "_ext" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _book_fixes():
    return _extension("book_fixes")


@pytest.mark.parametrize("language, pagename, href", [
    ("en", "intro", "zh/intro.html"),
    ("en", "chapters/01_attention", "../zh/chapters/01_attention.html"),
    ("zh_CN", "intro", "../intro.html"),
    ("zh_CN", "appendix/glossary", "../../appendix/glossary.html"),
])
def test_switch_links_to_the_same_page_in_the_other_language(language, pagename, href):
    app = SimpleNamespace(config=SimpleNamespace(language=language))
    context = {"body": "<h1>Title</h1>", "metatags": ""}
    _book_fixes().edition_switch(app, pagename, "page.html", context, None)
    assert context["body"].startswith(f'<p class="edition-switch"><a href="{href}"')
    assert context["body"].endswith("<h1>Title</h1>")
    assert 'rel="alternate"' in context["metatags"] and f'href="{href}"' in context["metatags"]


# The built Chinese edition -------------------------------------------------------------------


@pytest.fixture(scope="module")
def html() -> Path:
    return ensure_built_book()


_DISPLAY = re.compile(r'<div class="math notranslate nohighlight">(.*?)</div>', re.S)
_SWITCH = re.compile(r'<p class="edition-switch"><a href="([^"]+)"')


@pytest.mark.book
@pytest.mark.parametrize("docname", toc_docnames())
def test_chinese_page_exists_and_switches_back(html, docname):
    english = (html / f"{docname}.html").read_text(encoding="utf-8")
    path = html / "zh" / f"{docname}.html"
    assert path.is_file(), f"no Chinese page for {docname}"
    chinese = path.read_text(encoding="utf-8")
    assert '<html lang="zh-CN"' in chinese or "<html lang=\"zh_CN\"" in chinese
    to_chinese = _SWITCH.search(english).group(1)
    assert (path.parent / Path(docname).name).with_suffix(".html") == path
    assert ((html / docname).parent / to_chinese).resolve() == path.resolve()
    back = _SWITCH.search(chinese).group(1)
    assert (path.parent / back).resolve() == (html / f"{docname}.html").resolve()
    # Display math is the English page's, formula for formula.
    assert _DISPLAY.findall(chinese) == _DISPLAY.findall(english)


@pytest.mark.book
@pytest.mark.parametrize("page", zh_messages.COMPLETE)
def test_translated_page_reads_in_chinese(html, page):
    chinese = (html / "zh" / f"{page}.html").read_text(encoding="utf-8")
    title = re.search(r"<h1>(.*?)<", chinese, re.S).group(1)
    assert _HAN.search(title), f"{page}: the title {title!r} is not in Chinese"


def test_chinese_pages_open_the_chinese_notebooks_in_colab():
    colab = "https://colab.research.google.com/github/o/r/blob/main/"
    context = {"body": f'<a href="{colab}exercises/01_a.ipynb">a</a> {colab}chapters/02_b.ipynb '
                       '<a href="https://example.org/exercises/x.ipynb">x</a>'}
    app = SimpleNamespace(config=SimpleNamespace(language="zh_CN"))
    _book_fixes().chinese_notebook_links(app, "appendix/x", "page.html", context, None)
    assert context["body"] == (f'<a href="{colab}zh/exercises/01_a.ipynb">a</a> '
                               f'{colab}zh/chapters/02_b.ipynb '
                               '<a href="https://example.org/exercises/x.ipynb">x</a>')
    english = {"body": f'<a href="{colab}exercises/01_a.ipynb">a</a>'}
    app.config.language = "en"
    _book_fixes().chinese_notebook_links(app, "appendix/x", "page.html", english, None)
    assert english["body"] == f'<a href="{colab}exercises/01_a.ipynb">a</a>'


@pytest.mark.book
def test_chinese_exercise_page_opens_the_chinese_student_copies(html):
    page = (html / "zh" / "appendix" / "exercise_notebooks.html").read_text(encoding="utf-8")
    links = re.findall(r'href="(https://colab\.research\.google\.com/[^"]+)"', page)
    assert len(links) == len(list((ROOT / "exercises").glob("[0-9][0-9]_*.ipynb"))) > 0
    for link in links:
        folder, name = link.split("/blob/", 1)[1].split("/", 1)[1].rsplit("/", 1)
        assert folder == "zh/exercises" and (ROOT / folder / name).is_file(), link


_EXERCISE_TITLE = re.compile(r'<span class="caption-number">练习 [\d.]+ </span>\s*\((.*?)\)</p>', re.S)


@pytest.mark.book
@pytest.mark.parametrize("page", [p for p in zh_messages.COMPLETE if p.startswith("chapters/")])
def test_exercise_titles_are_translated(html, page):
    english = (html / f"{page}.html").read_text(encoding="utf-8")
    chinese = (html / "zh" / f"{page}.html").read_text(encoding="utf-8")
    titles = _EXERCISE_TITLE.findall(chinese)
    assert len(titles) == english.count('class="exercise admonition') > 0, page
    untranslated = [title for title in titles if not _HAN.search(title)]
    assert not untranslated, f"{page}: exercise titles in English: {untranslated}"


@pytest.mark.book
def test_glossary_table_and_sidebar_captions_are_translated(html):
    glossary = (html / "zh" / "appendix" / "glossary.html").read_text(encoding="utf-8")
    assert "<p>含义</p>" in glossary and "一次生成一个 token" in glossary
    intro = (html / "zh" / "intro.html").read_text(encoding="utf-8")
    assert 'caption-text">入门<' in intro and 'caption-text">附录<' in intro


# The Chinese notebooks ---------------------------------------------------------------------


def test_chinese_notebooks_are_in_step_with_the_english_ones_and_the_catalogs():
    stale = [path for path, text in zh_notebooks.targets().items()
             if not path.exists() or path.read_text(encoding="utf-8") != text]
    assert not stale, f"run python tools/zh_notebooks.py --write: {stale}"


@pytest.mark.parametrize("folder", zh_notebooks.SOURCES)
def test_chinese_notebooks_keep_the_code_and_metadata_of_the_english_ones(folder):
    import json

    for english in sorted((ROOT / folder).glob("[0-9][0-9]_*.ipynb")):
        chinese = ROOT / "zh" / folder / english.name
        en, zh = (json.loads(p.read_text(encoding="utf-8")) for p in (english, chinese))
        assert en["metadata"] == zh["metadata"], chinese  # the grader's chapter id included
        assert [c for c in en["cells"] if c["cell_type"] != "markdown"] == \
            [c for c in zh["cells"] if c["cell_type"] != "markdown"], chinese


def test_student_copy_exercise_headings_are_translated():
    english = ROOT / "exercises" / "04_normalisation.ipynb"
    text = zh_notebooks.translated_notebook(english, "chapters/04_normalisation")
    assert "**Exercise " not in text
    assert re.search(r"\*\*练习 1（热身：[^）]+）\*\*", text)


def test_translation_leaves_code_blocks_and_untranslated_text_alone():
    pairs = [("self-attention", "自注意力"), ("The mask.", "掩码。")]
    source = ("Causal self-attention over\nthe mask.\n\n````{solution} x\n\n"
              "```python\n# self-attention here\n```\n\nThe\n  mask.\n````\n")
    out = zh_notebooks.translate_markdown(source, pairs)
    assert out == ("Causal 自注意力 over\nthe mask.\n\n````{solution} x\n\n"
                   "```python\n# self-attention here\n```\n\n掩码。\n````\n")


# The Chinese edition's font -----------------------------------------------------------------


def test_edition_font_holds_exactly_the_characters_of_the_translations():
    from fontTools.ttLib import TTFont

    import make_glossary_font as fonts

    characters = fonts.edition_characters()
    assert "注意力" in "".join(characters) or len(characters) > 500
    in_font = "".join(sorted(chr(cp) for cp in TTFont(fonts.EDITION_FONT).getBestCmap()))
    assert in_font == characters, (
        "the Chinese edition's font does not match its text: run "
        "`python tools/make_glossary_font.py`")
    css = (ROOT / "_assets" / "book.css").read_text(encoding="utf-8")
    assert 'url("fonts/book-zh.woff")' in css and "html:lang(zh-CN)" in css


# Chinese search ---------------------------------------------------------------------------------


def _zh_search():
    return _extension("zh_search")


def test_search_indexes_chinese_characters_and_pairs():
    search = _zh_search()
    assert search.han_terms("多头注意力") == ["多", "头", "注", "意", "力",
                                          "多头", "头注", "注意", "意力"]
    assert search.han_terms("softmax 与缩放") == ["与", "缩", "放", "与缩", "缩放"]
    language = search.SearchChineseBigrams({})
    terms = language.split("用 softmax 计算注意力")
    assert "注意" in terms and "意力" in terms and "softmax" in terms and "用" in terms
    assert language.word_filter("力") and not language.word_filter("a")


def test_search_splits_a_query_in_the_browser_as_the_index_was_cut():
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    search = _zh_search()
    script = search.SearchChineseBigrams.js_splitter_code + (
        'console.log(JSON.stringify(splitQuery("注意力 softmax 头")));')
    out = subprocess.run([node, "-e", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == '["注意","意力","softmax","头"]'


def test_chinese_pages_download_the_chinese_notebooks(tmp_path: Path):
    import build_book

    html, notebooks = tmp_path / "html", tmp_path / "zh"
    (html / "_sources" / "chapters").mkdir(parents=True)
    (notebooks / "chapters").mkdir(parents=True)
    (html / "_sources" / "chapters" / "01_a.ipynb").write_text("english")
    (notebooks / "chapters" / "01_a.ipynb").write_text("中文")
    (notebooks / "chapters" / "99_not_in_the_book.ipynb").write_text("中文")
    assert build_book.serve_chinese_notebooks(html, notebooks) == 1
    assert (html / "_sources" / "chapters" / "01_a.ipynb").read_text() == "中文"
    assert not (html / "_sources" / "chapters" / "99_not_in_the_book.ipynb").exists()


def test_chinese_punctuation_stays_on_the_line_of_the_formula_before_it():
    math = '<span class="math notranslate nohighlight">\\(X\\)</span>'
    context = {"body": f"<p>矩阵 {math}；然后 {math}，再 {math}。</p>"}
    _book_fixes().fix_body(None, "page", "page.html", context, None)
    for mark in "；，。":
        assert f'<span class="math-nowrap">{math}{mark}</span>' in context["body"]


# The explorers' own words (_ext/zh_widgets.py) -------------------------------------------------


def _zh_widgets():
    return _extension("zh_widgets")


def _explorer_state() -> dict:
    def model(name, **fields):
        return {"model_name": name, "state": fields}

    return {
        "a": model("HTMLModel", value="<b>Caption.</b> Try it.", placeholder="\u200b"),
        "b": model("HTMLModel", value="<p>d = 4: 0.25</p>", _dom_classes=["explorer-frame"]),
        "c": model("SelectionSliderModel", description="heads", _options_labels=["1", "2"],
                   index=0),
        "d": model("DropdownModel", description="stack", _options_labels=["decoder", "encoder"],
                   index=1),
        "e": model("AccordionModel", titles=["Live (needs a kernel)"]),
        "f": model("StackModel", titles=["", ""], selected_index=0),
    }


def test_explorer_words_are_found_and_frames_and_numbers_left_alone():
    words = _zh_widgets().strings(_explorer_state())
    assert words == ["<b>Caption.</b> Try it.", "heads", "stack", "decoder", "encoder",
                     "Live (needs a kernel)"]


def test_explorer_words_are_translated_and_the_values_kept():
    zh_widgets = _zh_widgets()
    state = _explorer_state()
    chinese = {"<b>Caption.</b> Try it.": "<b>说明。</b>试试。", "heads": "头数",
               "decoder": "解码器", "Live (needs a kernel)": "实时（需要内核）"}
    assert zh_widgets.translate_state(state, lambda text: chinese.get(text, text)) == 4
    assert state["a"]["state"]["value"] == "<b>说明。</b>试试。"
    assert state["b"]["state"]["value"] == "<p>d = 4: 0.25</p>"  # a frame: as drawn
    assert state["c"]["state"] == {"description": "头数", "_options_labels": ["1", "2"],
                                   "index": 0}
    assert state["d"]["state"]["_options_labels"] == ["解码器", "encoder"]  # no translation yet
    assert state["d"]["state"]["index"] == 1
    assert state["e"]["state"]["titles"] == ["实时（需要内核）"]


def test_chinese_page_gets_translated_widget_state():
    zh_widgets = _zh_widgets()
    import json

    body = json.dumps({"version_major": 2, "state": _explorer_state()})
    script = SimpleNamespace(attributes={"type": zh_widgets.STATE_TYPE, "body": body})
    app = SimpleNamespace(zh_widget_translations={"<b>Caption.</b> Try it.": "<b>说明</b>：试试"})
    zh_widgets._translate_page(app, "chapters/01_x", "page.html", {"script_files": [script]}, None)
    assert "</" not in script.attributes["body"]  # nothing closes the script element early
    state = json.loads(script.attributes["body"])["state"]
    assert state["a"]["state"]["value"] == "<b>说明</b>：试试"


def test_explorer_words_catalog_is_complete():
    assert zh_messages.problems(zh_messages.WIDGETS) == []


@pytest.mark.book
def test_explorer_words_catalog_is_in_step_with_the_english_pages(html):
    with zh_messages.catalog(zh_messages.WIDGETS).open("rb") as f:
        held = {m.id for m in read_po(f) if m.id}
    found = zh_messages.widget_messages(html)
    assert len(found) == 9, sorted(found)  # chapters 1-9 each have an explorer
    missing = {page: [t for t in texts if t not in held] for page, texts in found.items()}
    assert not any(missing.values()), f"run `make locales` and translate: {missing}"


@pytest.mark.book
@pytest.mark.parametrize("page", [f"chapters/{p.stem}" for p in
                                  sorted((ROOT / "chapters").glob("0[1-9]_*.ipynb"))])
def test_chinese_explorers_speak_chinese(html, page):
    zh_widgets = _zh_widgets()
    with zh_messages.catalog(zh_messages.WIDGETS).open("rb") as f:
        kept = {m.id for m in read_po(f) if m.id and m.string == m.id}  # names: no translation
    english = zh_widgets.strings(zh_widgets.page_state(
        (html / f"{page}.html").read_text(encoding="utf-8"))["state"])
    chinese = zh_widgets.strings(zh_widgets.page_state(
        (html / "zh" / f"{page}.html").read_text(encoding="utf-8"))["state"])
    assert len(chinese) == len(english)
    still_english = [text for text in chinese if text in english and text not in kept]
    assert not still_english, f"{page}: {still_english}"
    captions = [text for text in chinese if text.startswith("<b>")]
    assert captions and all(_HAN.search(text) for text in captions), page
