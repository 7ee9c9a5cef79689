"""The book's editions in other languages: their configs, catalogs, notebooks, fonts, search
and built pages, for every language of ``book_languages`` (``_config.yml``).

The catalogs (locales/<code>) must be in step with the English pages, and every page a
language lists as ``complete`` translated throughout: no untranslated or fuzzy message, the
inline math of every translation the same as its English message's, display math never
translated. A translated edition lies in _build/html/<folder>, one page for every English
page. What the tests check of one language in particular (the Chinese words of its glossary
and captions) is the Chinese edition's data, named as such.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po, write_po

from book_support import ROOT, config, ensure_built_book, toc_docnames
from i18n import editions, fonts, languages, messages, notebooks
from notebook_smoke import explorer_cells

TRANSLATIONS = languages.translations()
SCRIPTED = [language for language in TRANSLATIONS if language.script]
CHINESE = languages.edition("zh")  # the Chinese edition: the examples below are its data
_HAN = CHINESE.letters()


def _ids(found):
    return [language.code for language in found]


# The list of languages ---------------------------------------------------------------------


def test_languages_are_the_source_then_the_chinese_edition():
    assert [language.code for language in languages.languages()][:1] == ["en"]
    assert CHINESE.code == "zh_CN" and CHINESE in TRANSLATIONS
    assert (CHINESE.script, CHINESE.search) == ("cjk", "bigram")
    assert CHINESE.font.file == "_assets/fonts/book-zh.woff"
    assert CHINESE.termbase.column in (ROOT / CHINESE.termbase.page).read_text(encoding="utf-8")


@pytest.mark.parametrize("change, message", [
    ({"script": "runic"}, "script 'runic'"),
    ({"search": "words"}, "search 'words'"),
    ({"colour": "red"}, "unknown keys ['colour']"),
    ({"folder": ""}, "needs ['folder']"),
    ({"script": ""}, "give script too"),
])
def test_a_wrong_language_entry_is_named(change, message):
    base = config()
    entry = {**base["sphinx"]["config"]["book_languages"][1], **change}
    base["sphinx"]["config"]["book_languages"][1] = entry
    with pytest.raises(ValueError, match=re.escape(message)):
        languages.languages(base)


def test_two_editions_in_one_folder_are_refused():
    base = config()
    entries = base["sphinx"]["config"]["book_languages"]
    entries.append({**entries[1], "code": "zh_TW"})
    with pytest.raises(ValueError, match="share one edition"):
        languages.languages(base)


def test_tools_and_search_know_the_same_scripts():
    search = _extension("i18n_search")
    assert search.SCRIPT_LETTERS == languages.LETTERS
    assert set(search.SCRIPT_PROPERTY) == set(languages.SCRIPTS) == set(languages.LETTERS)


# The generated configs ---------------------------------------------------------------------


def test_chinese_config_changes_only_language_locales_execution_and_address():
    english = config()
    chinese = editions.edition_config("zh")
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
    assert chinese["sphinx"]["local_extensions"] == {  # absolute: see tools/i18n/editions.py
        name: str(ROOT / folder) for name, folder in english["sphinx"]["local_extensions"].items()}
    for key, value in english["sphinx"]["config"].items():
        assert chinese["sphinx"]["config"][key] == value, key
    assert config() == english  # the English config was not modified


@pytest.mark.parametrize("language", TRANSLATIONS, ids=_ids(TRANSLATIONS))
def test_every_translated_config_has_its_language_folder_and_title(language):
    english = config()
    translated = editions.edition_config(language.edition)
    assert translated["sphinx"]["config"]["language"] == language.code
    assert translated["repository"]["path_to_book"] == language.folder
    assert translated["html"]["baseurl"].endswith(f"/{language.folder}/")
    assert translated["title"] == language.title != english["title"]


def test_every_edition_shares_one_execute_cache_and_extraction_executes_nothing():
    english = editions.edition_config("en")
    assert english["execute"]["execute_notebooks"] == "cache"
    assert "book_languages" in english["sphinx"]["config"]  # every edition reads the list
    for language in TRANSLATIONS:
        translated = editions.edition_config(language.edition)
        assert english["execute"]["cache"] == translated["execute"]["cache"] == str(editions.CACHE)
        assert english["execute"]["raise_on_error"] is translated["execute"]["raise_on_error"] is True
    extraction = editions.edition_config("gettext")
    assert extraction["execute"]["execute_notebooks"] == "off"
    assert extraction["sphinx"]["config"]["gettext_compact"] is False  # one template a page
    with pytest.raises(ValueError, match="'xx'"):
        editions.edition_config("xx")


def test_written_config_reads_back(tmp_path: Path):
    import yaml

    out = editions.write("zh", tmp_path / "sub" / "zh.yml")
    assert yaml.safe_load(out.read_text(encoding="utf-8")) == editions.edition_config("zh")


# The catalog checks ------------------------------------------------------------------------


def _catalog(tmp_path: Path, found: list[tuple[str, str, bool]]) -> str:
    """A catalog ``page.po`` in ``tmp_path`` holding ``(english, chinese, fuzzy)`` messages."""
    catalog = Catalog(locale="zh_CN")
    for english, chinese, fuzzy in found:
        catalog.add(english, chinese, flags=("fuzzy",) if fuzzy else ())
    with (tmp_path / "page.po").open("wb") as f:
        write_po(f, catalog)
    return "page"


def test_a_finished_translation_has_no_problems(tmp_path):
    page = _catalog(tmp_path, [
        ("Softmax of $x$ and $y$.", "$y$ 与 $x$ 的 softmax。", False),
        ("$$\\sum_i x_i$$", "", False),  # display math left untranslated
        ("Scores {math}`QK^\\top`.", "分数 {math}`QK^\\top`。", False)])
    assert messages.problems(page, tmp_path) == []


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
def test_each_problem_is_found(tmp_path, english, chinese, fuzzy, problem):
    page = _catalog(tmp_path, [(english, chinese, fuzzy), ("Fine.", "好。", False)])
    found = messages.problems(page, tmp_path)
    assert len(found) == 1 and problem in found[0], found


def test_a_missing_catalog_is_a_problem(tmp_path):
    assert "no catalog" in messages.problems("chapters/99_none", tmp_path)[0]


def test_translated_pages_are_pages_of_the_book():
    assert messages.toc_pages() == toc_docnames()
    for language in TRANSLATIONS:
        assert set(messages.complete(language)) <= set(toc_docnames()), language.code
    assert messages.complete(CHINESE) == tuple(toc_docnames())  # complete: true


_COMPLETE = [(language, page) for language in TRANSLATIONS for page in messages.complete(language)]


@pytest.mark.parametrize("language, page", _COMPLETE,
                         ids=[f"{language.code}:{page}" for language, page in _COMPLETE])
def test_translated_page_is_complete(language, page):
    assert messages.problems(page, language.catalogs) == []


# The catalogs are in step with the English pages (extraction runs no notebook) -------------


@pytest.mark.book
def test_catalogs_hold_every_message_of_the_english_pages(tmp_path):
    templates = messages.extract(tmp_path / "gettext")
    stale = []
    for language in TRANSLATIONS:
        for page in toc_docnames():
            with (templates / f"{page}.pot").open("rb") as f:
                wanted = {m.id for m in read_po(f) if m.id}
            path = messages.catalog(page, language.catalogs)
            held = set()
            if path.exists():
                with path.open("rb") as f:
                    held = {m.id for m in read_po(f) if m.id}
            if wanted - held:
                stale.append(f"{language.code}: {page}: {len(wanted - held)} messages not in "
                             "its catalog")
    assert not stale, "run `make locales` and commit locales/:\n" + "\n".join(stale)


# The language switch -------------------------------------------------------------------------


def _extension(name: str):
    """The book's Sphinx extension ``_ext/<name>.py``, loaded as a module (``_ext`` on the
    path, as Jupyter Book puts it: the extensions import one another)."""
    sys.path.insert(0, str(ROOT / "_ext"))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "_ext" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "_ext"))
    return module


def _book_fixes():
    return _extension("book_fixes")


def _i18n_editions():
    return _extension("i18n_editions")


def _app(language: str, entries: list[dict] | None = None) -> SimpleNamespace:
    """A stand-in for Sphinx's app: the book's list of languages, this build's language."""
    if entries is None:
        entries = config()["sphinx"]["config"]["book_languages"]
    return SimpleNamespace(config=SimpleNamespace(
        language=language, book_languages=entries, html_static_path=["_assets"]))


@pytest.mark.parametrize("language, pagename, href", [
    ("en", "intro", "zh/intro.html"),
    ("en", "chapters/01_attention", "../zh/chapters/01_attention.html"),
    ("zh_CN", "intro", "../intro.html"),
    ("zh_CN", "appendix/glossary", "../../appendix/glossary.html"),
])
def test_switch_links_to_the_same_page_in_the_other_language(language, pagename, href):
    context = {"body": "<h1>Title</h1>", "metatags": ""}
    _i18n_editions().edition_switch(_app(language), pagename, "page.html", context, None)
    assert context["body"].startswith(f'<p class="edition-switch"><a href="{href}"')
    assert context["body"].endswith("<h1>Title</h1>")
    assert 'rel="alternate"' in context["metatags"] and f'href="{href}"' in context["metatags"]


def test_switch_links_to_every_other_edition_of_a_third_language():
    entries = [*config()["sphinx"]["config"]["book_languages"],
               {"code": "fr", "folder": "fr", "label": "Français", "hreflang": "fr",
                "title": "Les Transformers"}]
    context = {"body": "<h1>T</h1>", "metatags": ""}
    _i18n_editions().edition_switch(_app("fr", entries), "chapters/x", "page.html", context, None)
    links = re.findall(r'<a href="([^"]+)" hreflang="([^"]+)"', context["body"])
    assert links == [("../../chapters/x.html", "en"), ("../../zh/chapters/x.html", "zh-CN")]
    assert context["metatags"].count('rel="alternate"') == 2
    context = {"body": "<h1>T</h1>", "metatags": ""}
    _i18n_editions().edition_switch(_app("en", entries), "intro", "page.html", context, None)
    assert re.findall(r'<a href="([^"]+)"', context["body"]) == ["zh/intro.html", "fr/intro.html"]


def test_a_book_of_one_language_has_no_switch():
    context = {"body": "<h1>T</h1>", "metatags": ""}
    app = _app("en", config()["sphinx"]["config"]["book_languages"][:1])
    _i18n_editions().edition_switch(app, "intro", "page.html", context, None)
    assert context == {"body": "<h1>T</h1>", "metatags": ""}


def test_translated_edition_preloads_its_font_and_the_source_does_not():
    for language, preloaded in (("zh_CN", True), ("en", False)):
        context = {"metatags": "", "pathto": lambda path, _resource: f"../{path}"}
        _i18n_editions().preload_edition_font(_app(language), "intro", "page.html", context, None)
        assert ('<link rel="preload" href="../_static/fonts/book-zh.woff"' in context["metatags"]) \
            is preloaded, language


# The built Chinese edition -------------------------------------------------------------------


@pytest.fixture(scope="module")
def html() -> Path:
    return ensure_built_book()


_DISPLAY = re.compile(r'<div class="math notranslate nohighlight">(.*?)</div>', re.S)
_SWITCH = re.compile(r'<p class="edition-switch"><a href="([^"]+)"')


_EDITION_PAGES = [(language, docname) for language in TRANSLATIONS for docname in toc_docnames()]


@pytest.mark.book
@pytest.mark.parametrize("language, docname", _EDITION_PAGES,
                         ids=[f"{language.code}:{page}" for language, page in _EDITION_PAGES])
def test_translated_page_exists_and_switches_back(html, language, docname):
    english = (html / f"{docname}.html").read_text(encoding="utf-8")
    path = html / language.folder / f"{docname}.html"
    assert path.is_file(), f"no {language.code} page for {docname}"
    translated = path.read_text(encoding="utf-8")
    assert (f'<html lang="{language.hreflang}"' in translated
            or f'<html lang="{language.code}"' in translated)
    to_translated = re.search(rf'<a href="([^"]+)" hreflang="{language.hreflang}"', english)
    assert (path.parent / Path(docname).name).with_suffix(".html") == path
    assert ((html / docname).parent / to_translated.group(1)).resolve() == path.resolve()
    back = re.search(r'<a href="([^"]+)" hreflang="en"', translated).group(1)
    assert (path.parent / back).resolve() == (html / f"{docname}.html").resolve()
    assert _SWITCH.search(translated)
    # Display math is the English page's, formula for formula.
    assert _DISPLAY.findall(translated) == _DISPLAY.findall(english)


_READ = [(language, page) for language in SCRIPTED for page in messages.complete(language)]


@pytest.mark.book
@pytest.mark.parametrize("language, page", _READ,
                         ids=[f"{language.code}:{page}" for language, page in _READ])
def test_translated_page_reads_in_its_script(html, language, page):
    translated = (html / language.folder / f"{page}.html").read_text(encoding="utf-8")
    title = re.search(r"<h1>(.*?)<", translated, re.S).group(1)
    assert language.letters().search(title), f"{page}: the title {title!r} is not in {language.code}"


def test_translated_pages_open_their_notebooks_in_colab():
    colab = "https://colab.research.google.com/github/o/r/blob/main/"
    context = {"body": f'<a href="{colab}exercises/01_a.ipynb">a</a> {colab}chapters/02_b.ipynb '
                       '<a href="https://example.org/exercises/x.ipynb">x</a>'}
    _i18n_editions().edition_notebook_links(_app("zh_CN"), "appendix/x", "page.html", context, None)
    assert context["body"] == (f'<a href="{colab}zh/exercises/01_a.ipynb">a</a> '
                               f'{colab}zh/chapters/02_b.ipynb '
                               '<a href="https://example.org/exercises/x.ipynb">x</a>')
    english = {"body": f'<a href="{colab}exercises/01_a.ipynb">a</a>'}
    _i18n_editions().edition_notebook_links(_app("en"), "appendix/x", "page.html", english, None)
    assert english["body"] == f'<a href="{colab}exercises/01_a.ipynb">a</a>'


@pytest.mark.book
@pytest.mark.parametrize("language", TRANSLATIONS, ids=_ids(TRANSLATIONS))
def test_translated_exercise_page_opens_the_translated_student_copies(html, language):
    page = (html / language.folder / "appendix" / "exercise_notebooks.html").read_text(encoding="utf-8")
    links = re.findall(r'href="(https://colab\.research\.google\.com/[^"]+)"', page)
    assert len(links) == len(list((ROOT / "exercises").glob("[0-9][0-9]*_*.ipynb"))) > 0
    for link in links:
        folder, name = link.split("/blob/", 1)[1].split("/", 1)[1].rsplit("/", 1)
        assert folder == f"{language.folder}/exercises" and (ROOT / folder / name).is_file(), link


_EXERCISE_TITLE = re.compile(r'<span class="caption-number">练习 [\d.]+ </span>\s*\((.*?)\)</p>', re.S)


@pytest.mark.book
@pytest.mark.parametrize("page", [p for p in messages.complete(CHINESE) if p.startswith("chapters/")
                                  and "{exercise}" in (ROOT / f"{p}.ipynb").read_text("utf-8")])
def test_exercise_titles_are_translated(html, page):
    english = (html / f"{page}.html").read_text(encoding="utf-8")
    chinese = (html / CHINESE.folder / f"{page}.html").read_text(encoding="utf-8")
    titles = _EXERCISE_TITLE.findall(chinese)
    assert len(titles) == english.count('class="exercise admonition') > 0, page
    untranslated = [title for title in titles if not _HAN.search(title)]
    assert not untranslated, f"{page}: exercise titles in English: {untranslated}"


@pytest.mark.book
def test_glossary_table_and_sidebar_captions_are_translated(html):
    glossary = (html / CHINESE.folder / "appendix" / "glossary.html").read_text(encoding="utf-8")
    assert "<p>含义</p>" in glossary and "一次生成一个 token" in glossary
    intro = (html / CHINESE.folder / "intro.html").read_text(encoding="utf-8")
    assert 'caption-text">入门<' in intro and 'caption-text">附录<' in intro


# The translated notebooks -------------------------------------------------------------------


def test_translated_notebooks_are_in_step_with_the_english_ones_and_the_catalogs():
    targets = notebooks.targets()
    for language in TRANSLATIONS:  # every chapter and student copy, in every edition's folder
        for folder in notebooks.SOURCES:
            for english in sorted((ROOT / folder).glob("[0-9][0-9]*_*.ipynb")):
                assert ROOT / language.folder / folder / english.name in targets
    stale = [path for path, text in targets.items()
             if not path.exists() or path.read_text(encoding="utf-8") != text]
    assert not stale, f"run python tools/i18n notebooks --write: {stale}"


_FOLDERS = [(language, folder) for language in TRANSLATIONS for folder in notebooks.SOURCES]


@pytest.mark.parametrize("language, folder", _FOLDERS,
                         ids=[f"{language.code}:{folder}" for language, folder in _FOLDERS])
def test_translated_notebooks_keep_the_code_and_metadata_of_the_english_ones(language, folder):
    import json

    for english in sorted((ROOT / folder).glob("[0-9][0-9]*_*.ipynb")):
        translated = ROOT / language.folder / folder / english.name
        en, other = (json.loads(p.read_text(encoding="utf-8")) for p in (english, translated))
        assert en["metadata"] == other["metadata"], translated  # the grader's chapter id included
        assert [c for c in en["cells"] if c["cell_type"] != "markdown"] == \
            [c for c in other["cells"] if c["cell_type"] != "markdown"], translated


def test_student_copy_exercise_headings_are_translated():
    english = ROOT / "exercises" / "04b_training_recipe.ipynb"
    text = notebooks.translated_notebook(english, "chapters/04b_training_recipe", CHINESE)
    assert "**Exercise " not in text
    assert re.search(r"\*\*练习 1（核心：[^）]+）\*\*", text)  # the core exercise built inline
    assert re.search(r"\*\*练习 2（热身：[^）]+）\*\*", text)  # the first of the page's end


def test_exercise_headings_stay_english_in_a_language_without_their_words():
    french = languages.parse({"code": "fr", "folder": "fr", "label": "Français",
                              "hreflang": "fr", "title": "Les Transformers"})
    heading = "**Exercise 2 (Warm-up: norms)**\n\n**Exercise 3**"
    assert notebooks._EXERCISE_HEAD.sub(
        lambda match: notebooks.exercise_heading(match, french), heading) == heading
    assert notebooks._EXERCISE_HEAD.sub(
        lambda match: notebooks.exercise_heading(match, CHINESE), heading) == \
        "**练习 2（Warm-up: norms）**\n\n**练习 3**"


def test_translation_leaves_code_blocks_and_untranslated_text_alone():
    pairs = [("self-attention", "自注意力"), ("The mask.", "掩码。")]
    source = ("Causal self-attention over\nthe mask.\n\n````{solution} x\n\n"
              "```python\n# self-attention here\n```\n\nThe\n  mask.\n````\n")
    out = notebooks.translate_markdown(source, pairs)
    assert out == ("Causal 自注意力 over\nthe mask.\n\n````{solution} x\n\n"
                   "```python\n# self-attention here\n```\n\n掩码。\n````\n")


# The editions' fonts ------------------------------------------------------------------------


_FONTED = [language for language in TRANSLATIONS if language.font]


@pytest.mark.parametrize("language", _FONTED, ids=_ids(_FONTED))
def test_edition_font_holds_exactly_the_characters_of_the_translations(language):
    from fontTools.ttLib import TTFont

    characters = fonts.edition_characters(language)
    assert len(characters) > 500
    in_font = "".join(sorted(chr(cp) for cp in TTFont(ROOT / language.font.file).getBestCmap()))
    assert in_font == characters, (
        f"the {language.code} edition's font does not match its text: run "
        "`python tools/i18n fonts`")
    css = (ROOT / "_assets" / "book.css").read_text(encoding="utf-8")
    served = Path(language.font.file).relative_to("_assets").as_posix()
    assert f'url("{served}")' in css and f"html:lang({language.hreflang})" in css
    assert f'font-family: "{language.font.family}"' in css


def test_chinese_edition_font_has_the_courses_words():
    assert set("注意力") <= set(fonts.edition_characters(CHINESE))


# Search for scripts without spaces ---------------------------------------------------------------


def _i18n_search():
    return _extension("i18n_search")


def test_search_indexes_characters_and_pairs_of_the_script():
    search = _i18n_search()
    assert search.script_terms("多头注意力", "cjk") == ["多", "头", "注", "意", "力",
                                                   "多头", "头注", "注意", "意力"]
    assert search.script_terms("softmax 与缩放", "cjk") == ["与", "缩", "放", "与缩", "缩放"]
    language = search.bigram_search("zh_CN", "cjk")({})
    assert language.lang == "zh_CN"
    terms = language.split("用 softmax 计算注意力")
    assert "注意" in terms and "意力" in terms and "softmax" in terms and "用" in terms
    assert language.word_filter("力") and not language.word_filter("a")
    with pytest.raises(ValueError, match="'runic'"):
        search.bigram_search("xx", "runic")


def test_bigram_search_is_registered_for_the_editions_that_ask_for_it():
    search = _i18n_search()
    registered = []
    app = SimpleNamespace(add_search_language=registered.append)
    for language in languages.languages():
        search._register(app, _app(language.code).config)
    assert [cls.lang for cls in registered] == \
        [language.code for language in TRANSLATIONS if language.search == "bigram"]
    assert registered and registered[0].lang == "zh_CN"


def test_search_splits_a_query_in_the_browser_as_the_index_was_cut():
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    search = _i18n_search()
    script = search.bigram_search("zh_CN", "cjk").js_splitter_code + (
        'console.log(JSON.stringify(splitQuery("注意力 softmax 头")));')
    out = subprocess.run([node, "-e", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == '["注意","意力","softmax","头"]'


def test_translated_pages_download_the_translated_notebooks(tmp_path: Path):
    import build_book

    html, folder = tmp_path / "html", tmp_path / "zh"
    (html / "_sources" / "chapters").mkdir(parents=True)
    (folder / "chapters").mkdir(parents=True)
    (html / "_sources" / "chapters" / "01_a.ipynb").write_text("english")
    (folder / "chapters" / "01_a.ipynb").write_text("中文")
    (folder / "chapters" / "99_not_in_the_book.ipynb").write_text("中文")
    assert build_book.serve_edition_notebooks(html, folder) == 1
    assert (html / "_sources" / "chapters" / "01_a.ipynb").read_text() == "中文"
    assert not (html / "_sources" / "chapters" / "99_not_in_the_book.ipynb").exists()


def test_chinese_punctuation_stays_on_the_line_of_the_formula_before_it():
    math = '<span class="math notranslate nohighlight">\\(X\\)</span>'
    context = {"body": f"<p>矩阵 {math}；然后 {math}，再 {math}。</p>"}
    _book_fixes().fix_body(None, "page", "page.html", context, None)
    for mark in "；，。":
        assert f'<span class="math-nowrap">{math}{mark}</span>' in context["body"]


# The explorers' own words (_ext/i18n_widgets.py) -----------------------------------------------


def _i18n_widgets():
    return _extension("i18n_widgets")


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
    words = _i18n_widgets().strings(_explorer_state())
    assert words == ["<b>Caption.</b> Try it.", "heads", "stack", "decoder", "encoder",
                     "Live (needs a kernel)"]


def test_explorer_words_are_translated_and_the_values_kept():
    widgets = _i18n_widgets()
    state = _explorer_state()
    chinese = {"<b>Caption.</b> Try it.": "<b>说明。</b>试试。", "heads": "头数",
               "decoder": "解码器", "Live (needs a kernel)": "实时（需要内核）"}
    assert widgets.translate_state(state, lambda text: chinese.get(text, text)) == 4
    assert state["a"]["state"]["value"] == "<b>说明。</b>试试。"
    assert state["b"]["state"]["value"] == "<p>d = 4: 0.25</p>"  # a frame: as drawn
    assert state["c"]["state"] == {"description": "头数", "_options_labels": ["1", "2"],
                                   "index": 0}
    assert state["d"]["state"]["_options_labels"] == ["解码器", "encoder"]  # no translation yet
    assert state["d"]["state"]["index"] == 1
    assert state["e"]["state"]["titles"] == ["实时（需要内核）"]


def test_translated_page_gets_translated_widget_state():
    widgets = _i18n_widgets()
    import json

    body = json.dumps({"version_major": 2, "state": _explorer_state()})
    script = SimpleNamespace(attributes={"type": widgets.STATE_TYPE, "body": body})
    app = SimpleNamespace(i18n_widget_translations={"<b>Caption.</b> Try it.": "<b>说明</b>：试试"})
    widgets._translate_page(app, "chapters/01_x", "page.html", {"script_files": [script]}, None)
    assert "</" not in script.attributes["body"]  # nothing closes the script element early
    state = json.loads(script.attributes["body"])["state"]
    assert state["a"]["state"]["value"] == "<b>说明</b>：试试"


def test_each_edition_loads_its_own_explorer_words(tmp_path):
    widgets = _i18n_widgets()
    catalog = Catalog(locale="zh_CN")
    catalog.add("heads", "头数")
    catalog.add("stack", "栈", flags=("fuzzy",))
    (tmp_path / "locales" / "zh_CN" / "LC_MESSAGES").mkdir(parents=True)
    with (tmp_path / "locales" / "zh_CN" / "LC_MESSAGES" / "widgets.po").open("wb") as f:
        write_po(f, catalog)
    for language, expected in (("zh_CN", {"heads": "头数"}), ("en", {})):
        app = _app(language)
        app.srcdir, app.config.locale_dirs = str(tmp_path), ["locales/"]
        widgets._load(app)
        assert app.i18n_widget_translations == expected, language


_WORDED = [language for language in TRANSLATIONS if messages.complete(language)]


@pytest.mark.parametrize("language", _WORDED, ids=_ids(_WORDED))
def test_explorer_words_catalog_is_complete(language):
    assert messages.problems(messages.WIDGETS, language.catalogs) == []


@pytest.mark.book
@pytest.mark.parametrize("language", _WORDED, ids=_ids(_WORDED))
def test_explorer_words_catalog_is_in_step_with_the_english_pages(html, language):
    with messages.catalog(messages.WIDGETS, language.catalogs).open("rb") as f:
        held = {m.id for m in read_po(f) if m.id}
    found = messages.widget_messages(html)
    assert len(found) == 9, sorted(found)  # chapters 1-9 each have an explorer
    missing = {page: [t for t in texts if t not in held] for page, texts in found.items()}
    assert not any(missing.values()), f"run `make locales` and translate: {missing}"


@pytest.mark.book
@pytest.mark.parametrize("page", [f"chapters/{p.stem}" for p in
                                  sorted((ROOT / "chapters").glob("0[1-9]*_*.ipynb"))
                                  if explorer_cells(nbformat.read(p, as_version=4))])
def test_chinese_explorers_speak_chinese(html, page):
    widgets = _i18n_widgets()
    with messages.catalog(messages.WIDGETS, CHINESE.catalogs).open("rb") as f:
        kept = {m.id for m in read_po(f) if m.id and m.string == m.id}  # names: no translation
    english = widgets.strings(widgets.page_state(
        (html / f"{page}.html").read_text(encoding="utf-8"))["state"])
    chinese = widgets.strings(widgets.page_state(
        (html / CHINESE.folder / f"{page}.html").read_text(encoding="utf-8"))["state"])
    assert len(chinese) == len(english)
    still_english = [text for text in chinese if text in english and text not in kept]
    assert not still_english, f"{page}: {still_english}"
    captions = [text for text in chinese if text.startswith("<b>")]
    assert captions and all(_HAN.search(text) for text in captions), page
