"""The book's sources and its build: table of contents, notebooks, setup cells, assets, pages.

The checks on the built HTML reuse ``_build/html`` (``make test`` builds it just before), or
build it first when it is missing or older than its sources.
"""
from __future__ import annotations

import ast
import re
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

import setup_cell  # tools/setup_cell.py
from book_support import (
    BOOK_LOG,
    ROOT,
    config,
    ensure_built_book,
    launch_urls,
    notebook_docnames,
    source_of,
    toc_docnames,
)

ASSETS = ROOT / "_assets"
ASSET_BUDGET = 6.5 * 2**20  # bytes: the vendored JavaScript, fonts and MathJax subset
CHAPTER_PATHS = sorted((ROOT / "chapters").glob("*.ipynb"))
MAX_CODE_LINE = 90  # characters: wider lines scroll sideways in the ~750 px content column


# Sources ----------------------------------------------------------------------------------


def test_toc_lists_existing_pages_and_every_notebook():
    docnames = toc_docnames()
    assert docnames[0] == "intro"
    assert len(docnames) == len(set(docnames)), "a page is listed twice"
    for docname in docnames:
        source_of(docname)  # raises if the page does not exist
        both = [ROOT / f"{docname}{s}" for s in (".md", ".ipynb")]
        assert not all(p.exists() for p in both), f"{docname} has both .md and .ipynb"
    listed = {source_of(d) for d in docnames}
    for nb_path in setup_cell.notebooks():
        assert nb_path in listed, f"{nb_path.relative_to(ROOT)} is not in _toc.yml"


def test_setup_chapter_and_appendix_pages_are_listed():
    docnames = toc_docnames()
    for page in ("chapters/00_setup", "appendix/notation", "appendix/glossary",
                 "appendix/references", "appendix/interactive_figures"):
        assert page in docnames


@pytest.mark.parametrize("path", setup_cell.notebooks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_notebook_is_stored_without_outputs(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"cell {i} of {path.name} has stored outputs"
            assert cell.execution_count is None, f"cell {i} of {path.name} has an execution count"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"


@pytest.mark.parametrize("path", setup_cell.notebooks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_setup_cell_agrees_with_config(path: Path):
    nb = nbformat.read(path, as_version=4)
    problems = setup_cell.problems(nb, setup_cell.setup_cell_source())
    assert not problems, (f"{path.relative_to(ROOT)}: {'; '.join(problems)}. "
                          "Run `make setup-cells` (or `make book`) to rewrite the setup cells.")
    url, branch = setup_cell.repository()
    assert f'"git+{url}@{branch}"' in nb.cells[1].source
    assert "TRANSFORMER_LIB_SOURCE" in nb.cells[1].source


def test_setup_cell_follows_the_repository_in_config(tmp_path: Path):
    """Moving the course means editing repository.url in _config.yml: the cell follows."""
    text = (ROOT / "_config.yml").read_text(encoding="utf-8")
    url, branch = setup_cell.repository()
    moved = tmp_path / "_config.yml"
    moved.write_text(text.replace(url, "https://github.com/someone/fork"), encoding="utf-8")
    assert setup_cell.repository(moved) == ("https://github.com/someone/fork", branch)
    source = setup_cell.setup_cell_source(moved)
    assert f"git+https://github.com/someone/fork@{branch}" in source
    assert url not in source


def test_setup_cell_does_nothing_where_the_library_is_installed(monkeypatch):
    calls = []
    monkeypatch.setattr("subprocess.run", lambda *a, **k: calls.append(a))
    exec(setup_cell.setup_cell_source(), {})  # transformer_lib is installed here
    assert calls == []


@pytest.mark.parametrize("path", CHAPTER_PATHS, ids=lambda p: p.name)
def test_code_lines_fit_the_column(path: Path):
    """Every line of every code cell, the setup cell included, is at most 90 characters."""
    nb = nbformat.read(path, as_version=4)
    long = [f"cell {i}, {len(line)} characters: {line.strip()[:60]!r}"
            for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            for line in cell.source.split("\n") if len(line) > MAX_CODE_LINE]
    assert not long, f"{path.name}: lines over {MAX_CODE_LINE} characters:\n" + "\n".join(long)


def _bullet_markers(markdown: str) -> list[tuple[int, str]]:
    """(line, marker) of every bullet list in ``markdown`` (CommonMark), directives' bodies
    included (a fence whose info string starts with ``{``; its ``:option:`` lines blanked)."""
    from markdown_it import MarkdownIt

    found = []
    for token in MarkdownIt("commonmark").parse(markdown):
        if token.type == "bullet_list_open":
            found.append((token.map[0], token.markup))
        elif token.type == "fence" and token.info.startswith("{") and \
                not token.info.startswith(("{code", "{math")):
            body = "\n".join("" if line.startswith(":") else line
                             for line in token.content.split("\n"))
            found += [(token.map[0] + 1 + line, marker)
                      for line, marker in _bullet_markers(body)]
    return found


def test_bullet_lint_sees_a_line_that_starts_with_a_plus():
    text = "- an item that wraps into\n  + a line that Markdown reads as a nested list\n"
    assert _bullet_markers(text) == [(0, "-"), (1, "+")]
    assert _bullet_markers("```{exercise} x\n:label: y\n\nText\n* a star\n```\n") == [(4, "*")]


@pytest.mark.parametrize("path", [*CHAPTER_PATHS, *sorted((ROOT / "appendix").glob("*.md")),
                                  ROOT / "intro.md"], ids=lambda p: p.name)
def test_lists_use_dashes_so_a_wrapped_plus_is_no_list(path: Path):
    """The book's lists use "- ". A wrapped line that starts with "+ " or "* " (a sum, an
    emphasis) becomes a nested list item in Markdown, so no list may use those markers."""
    if path.suffix == ".ipynb":
        cells = [c.source for c in nbformat.read(path, as_version=4).cells
                 if c.cell_type == "markdown"]
    else:
        cells = [path.read_text(encoding="utf-8")]
    wrong = [f"cell {i}, line {line + 1}: {cell.splitlines()[line].strip()[:60]!r}"
             for i, cell in enumerate(cells) for line, marker in _bullet_markers(cell)
             if marker != "-" and line < len(cell.splitlines())]
    assert not wrong, f"{path.name}: lists marked with + or * (rewrap the line):\n" + "\n".join(wrong)


IMPORT_CELL_FOLDED_FROM = 12  # lines: a longer import cell is folded in the book


@pytest.mark.parametrize("path", CHAPTER_PATHS, ids=lambda p: p.name)
def test_long_import_cell_is_folded_and_said_in_prose(path: Path):
    """The chapter starts with its subject: a long import cell is folded (``hide-cell``) behind
    a line that says what it brings in (the cell's own ``code_prompt_show``)."""
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code" and not setup_cell.is_setup_cell(c)]
    imports = code[0]
    if path.name == "00_setup.ipynb":  # the setup page's imports are its subject: shown
        assert not {"hide-input", "hide-cell"} & set(imports.metadata.get("tags", []))
        return
    if len(imports.source.splitlines()) < IMPORT_CELL_FOLDED_FROM:
        return
    assert "hide-cell" in imports.metadata.get("tags", []), (
        f"{path.name}: the import cell has {len(imports.source.splitlines())} lines; tag it "
        "hide-cell")
    label = imports.metadata.get("mystnb", {}).get("code_prompt_show", "")
    assert label.startswith("Show the imports"), f"{path.name}: the fold does not say what it holds"
    modules = {m.split(".")[0] for m in re.findall(r"from transformer_lib\.([\w.]+)",
                                                   imports.source)}
    missing = [m for m in sorted(modules) if m not in label]
    assert not missing, f"{path.name}: the fold's label does not name {missing}"


REFERENCE_LABELS = set(re.findall(r"^\d+\. \(([a-z0-9-]+)\)=$",
                                  (ROOT / "appendix" / "references.md").read_text(encoding="utf-8"),
                                  flags=re.M))
CITATION = re.compile(r"\b[A-Z][A-Za-z-]+(?: et al\.|,? and [A-Z][a-z]+)?,? \(?(?:19|20)\d\d\)?")


def test_references_have_labels():
    assert {"vaswani-2017", "dao-2022", "yang-2024-gated"} <= REFERENCE_LABELS
    assert len(REFERENCE_LABELS) >= 25


@pytest.mark.parametrize("path", CHAPTER_PATHS, ids=lambda p: p.name)
def test_citations_link_to_their_reference(path: Path):
    """An author-year citation is a Markdown link to its entry in References: a link in the
    book, plain text in Jupyter and Colab. Each link names a label of references.md."""
    nb = nbformat.read(path, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    labels = re.findall(r"\]\(#([a-z0-9-]+)\)", text)
    unknown = sorted(set(labels) - REFERENCE_LABELS - _heading_anchors(nb))
    assert not unknown, f"{path.name}: links to labels references.md does not define: {unknown}"
    linked = re.sub(r"\[[^\]]*\]\(#[a-z0-9-]+\)", "", text)  # drop the linked citations
    plain = [m.group(0) for m in CITATION.finditer(linked)
             if re.search(r"et al|, (?:19|20)\d\d|\((?:19|20)\d\d\)", m.group(0))]
    assert not plain, f"{path.name}: citations without a link to References: {plain}"


def _heading_anchors(nb) -> set[str]:
    """Labels the notebook defines itself (``(label)=`` lines)."""
    return {m for c in nb.cells if c.cell_type == "markdown"
            for m in re.findall(r"^\(([a-z0-9-]+)\)=$", c.source, flags=re.M)}


def test_glossary_covers_the_later_chapters():
    glossary = (ROOT / "appendix" / "glossary.md").read_text(encoding="utf-8")
    terms = [row.split("|")[1].strip() for row in glossary.splitlines()
             if row.startswith("| ") and not row.startswith("| term")]
    assert terms == sorted(terms, key=lambda t: re.sub(r"[^a-z0-9 ]", "", t.lower())), (
        "glossary rows are not in alphabetical order")
    for term in ("multi-query attention, MQA", "multi-head latent attention, MLA", "SwiGLU",
                 "FlashAttention", "online softmax", "log-sum-exp", "tile, tiling", "DeltaNet",
                 "Gated DeltaNet", "chunkwise-parallel form", "mixture of experts, MoE",
                 "router", "load balancing", "sliding-window attention", "top-$k$ sampling",
                 "temperature", "greedy decoding", "decode", "prefill", "KV cache"):
        assert term in terms, f"the glossary lacks {term!r}"


def test_execution_settings():
    execute = config()["execute"]
    assert execute["execute_notebooks"] == "force"
    assert execute["raise_on_error"] is True
    assert 0 < execute["timeout"] <= 600


def test_vendored_assets_exist_and_stay_small():
    sphinx = config()["sphinx"]["config"]
    assert sphinx["html_static_path"] == ["_assets"]
    # A folder named _static would make Jupyter Book inject every .js under every static
    # path (MathJax's extensions and the widget manager included) into every page.
    assert not (ROOT / "_static").exists()
    assert (ASSETS / sphinx["mathjax_path"]).is_file()
    for script in sphinx["nb_ipywidgets_js"]:
        assert "://" not in script, f"{script} is not served by the book"
        assert (ASSETS / script).is_file(), script
    size = sum(p.stat().st_size for p in ASSETS.rglob("*") if p.is_file())
    assert size <= ASSET_BUDGET, f"_assets holds {size / 2**20:.1f} MiB"
    readme = (ASSETS / "README.md").read_text(encoding="utf-8")
    for package in ("@jupyter-widgets/html-manager", "requirejs", "mathjax"):
        assert package in readme, f"{package} is not listed in _assets/README.md"


def test_book_extension_fixes_line_breaks_and_drops_the_second_navbar():
    """_ext/book_fixes.py: punctuation after inline math stays on its line, long names in
    inline code break before a dot or after an underscore while short code stays whole, the
    theme's top bar is left out."""
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("book_fixes", ROOT / "_ext" / "book_fixes.py")
    fixes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixes)
    math = '<span class="math notranslate nohighlight">\\(x\\)</span>'
    code = '<code class="docutils literal notranslate"><span class="pre">{}</span></code>'
    context = {"body": f"<p>at {math}, then {math} alone; "
                       + code.format("transformer_lib.encoder_decoder.Enc") + " "
                       + code.format("__init__") + code.format("[0.5,") + "</p>"
                       + '<div class="math notranslate nohighlight">\\[y\\]</div>.'}
    fixes.fix_body(None, "page", "page.html", context, None)
    body = context["body"]
    assert f'<span class="math-nowrap">{math},</span>' in body
    assert f"{math} alone" in body  # no punctuation after it: left as it was
    assert "transformer_<wbr>lib<wbr>.encoder_<wbr>decoder<wbr>.Enc" in body
    assert '<span class="pre">__init__</span>' in body  # no break inside the underscores
    assert '<span class="pre">[0.5,</span>' in body  # nor in a number
    assert '<div class="math notranslate nohighlight">\\[y\\]</div>.' in body  # display math
    shape = ('<code class="docutils literal notranslate"><span class="pre">(B,</span> '
             '<span class="pre">H,</span> <span class="pre">T,</span> <span class="pre">D)</span></code>')
    context = {"body": shape + code.format("nn.Linear")}
    fixes.fix_body(None, "page", "page.html", context, None)
    # Short inline code stays whole: no-break spaces in a shape, no break in a short name.
    assert context["body"] == (shape.replace("</span> <span", "</span>&#160;<span")
                               + code.format("nn.Linear"))
    # A long signature's parameters, one a line: lines in a div, not a list without terms.
    signature = ('<dt class="sig sig-object py" id="f"><span class="sig-name">f</span>'
                 '(<dl>\n<dd><em class="sig-param">x</em>,</dd>\n</dl>\n)</dt><dd><dl '
                 'class="field-list"><dt>Args</dt><dd>x</dd></dl></dd>')
    context = {"body": signature}
    fixes.fix_body(None, "page", "page.html", context, None)
    assert '<div class="sig-params">\n<div class="sig-param-line"><em class="sig-param">x</em>,' \
        in context["body"]
    assert "(<dl>" not in context["body"]
    assert '<dl class="field-list"><dt>Args</dt><dd>x</dd></dl>' in context["body"]  # kept

    config = SimpleNamespace(html_theme_options={})
    fixes.drop_navbar(None, config)
    assert config.html_theme_options == {"navbar_persistent": []}
    config = SimpleNamespace(html_theme_options={"navbar_persistent": ["search-field"]})
    fixes.drop_navbar(None, config)  # a book's own choice stands
    assert config.html_theme_options["navbar_persistent"] == ["search-field"]


# The built book ---------------------------------------------------------------------------


class _OutputImages(HTMLParser):
    """The ``(src, alt)`` of every ``<img>`` inside a cell's output on a page."""

    def __init__(self):
        super().__init__()
        self.images: list[tuple[str, str | None]] = []
        self._depth = 0  # open <div>s
        self._output_depth = None  # the depth of the open cell output, if inside one

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "div":
            self._depth += 1
            if self._output_depth is None and "cell_output" in (attrs.get("class") or "").split():
                self._output_depth = self._depth
        elif tag == "img" and self._output_depth is not None:
            self.images.append((attrs.get("src", ""), attrs.get("alt")))

    def handle_endtag(self, tag):
        if tag == "div":
            if self._output_depth == self._depth:
                self._output_depth = None
            self._depth -= 1


def missing_alt_text(page_html: str) -> list[str]:
    """The output images of a page without alt text. Without ``mystnb.image.alt`` in the
    cell's metadata, docutils writes the image's own path as its alt text: that counts as
    missing."""
    parser = _OutputImages()
    parser.feed(page_html)
    missing = []
    for src, alt in parser.images:
        alt = (alt or "").strip()
        if not alt or alt == src or re.search(r"\.(png|jpe?g|svg|gif|webp)$", alt, re.I):
            missing.append(src)
    return missing


def test_missing_alt_text_is_found_in_a_small_page():
    page = ('<div class="cell_output docutils container"><img alt="../_images/a.png" '
            'src="../_images/a.png" /><img src="b.png"><img alt="Loss falls from 4.2 to 0.3" '
            'src="c.png" /></div><img src="logo.png">')
    assert missing_alt_text(page) == ["../_images/a.png", "b.png"]


class _Page(HTMLParser):
    """The links and scripts of one HTML page."""

    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.scripts: list[str] = []
        self.inline_scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        if tag == "script":
            if attrs.get("src"):
                self.scripts.append(attrs["src"])
            elif not attrs.get("type") or "javascript" in attrs.get("type", ""):
                self._in_script = True
                self.inline_scripts.append("")

    def handle_data(self, data):
        if self._in_script:
            self.inline_scripts[-1] += data

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


@pytest.fixture(scope="module")
def html() -> Path:
    return ensure_built_book()


@pytest.mark.book
def test_build_log_has_no_warnings(html):
    log = BOOK_LOG.read_text(encoding="utf-8", errors="replace")
    warnings = [line for line in log.splitlines()
                if re.search(r"\bWARNING\b", line) and "[IPKernelApp]" not in line]
    assert not warnings, "\n".join(warnings[:20])
    assert not (html / "reports").exists(), "execution reports were written: a notebook failed"


@pytest.mark.book
@pytest.mark.parametrize("docname", toc_docnames())
def test_page_is_built_and_uses_no_outside_scripts(html, docname):
    path = html / f"{docname}.html"
    assert path.is_file()
    page = _parse(path)
    outside = [s for s in page.scripts if "://" in s or s.startswith("//")]
    assert not outside, f"{docname} loads scripts from elsewhere: {outside}"
    assert any("_static/mathjax/tex-chtml.js" in s for s in page.scripts) or "class=\"math" not in \
        path.read_text(encoding="utf-8"), f"{docname} has math but not the local MathJax"
    inline = [s.strip() for s in page.inline_scripts if s.strip()]
    duplicated = {s for s in inline if inline.count(s) > 1}
    assert not duplicated, f"{docname} repeats inline scripts: {duplicated}"
    assert launch_urls(docname)["repository"] in page.links, "no repository button"


@pytest.mark.book
@pytest.mark.parametrize("docname", notebook_docnames())
def test_notebook_page_has_launch_buttons(html, docname):
    page = _parse(html / f"{docname}.html")
    expected = launch_urls(docname)
    assert expected["colab"] in page.links, f"no Colab link {expected['colab']}"
    assert expected["binder"] in page.links, f"no Binder link {expected['binder']}"


@pytest.mark.book
@pytest.mark.parametrize("docname", [d for d in notebook_docnames() if d.startswith("chapters/")])
def test_every_output_image_has_alt_text(html, docname):
    missing = missing_alt_text((html / f"{docname}.html").read_text(encoding="utf-8"))
    assert not missing, (f"{docname}: images without alt text (set the cell's metadata "
                         f'"mystnb": {{"image": {{"alt": "..."}}}}): {missing}')


@pytest.mark.book
@pytest.mark.parametrize("docname", notebook_docnames())
def test_setup_cell_runs_but_is_not_shown(html, docname):
    """Tagged remove-cell: executed by the build (the page has the outputs after it) but
    neither its code nor its output is on the page."""
    page = (html / f"{docname}.html").read_text(encoding="utf-8")
    assert setup_cell.SOURCE_VARIABLE not in page, f"{docname} shows the setup cell"
    assert 'class="cell_output' in page, f"{docname} has no executed output at all"


@pytest.mark.book
def test_citation_links_reach_their_entry(html):
    references = (html / "appendix" / "references.html").read_text(encoding="utf-8")
    for label in REFERENCE_LABELS:
        assert f'id="{label}"' in references, f"References has no anchor {label}"
    page = (html / "chapters" / "08_fast_attention.html").read_text(encoding="utf-8")
    assert '../appendix/references.html#dao-2022"' in page


@pytest.mark.book
def test_interactive_figures_page_links_to_every_chapters_explorer(html):
    """The appendix embeds no widget (each explorer lives in its chapter): it links to the
    section of every chapter 1-9 that holds one, and every link lands on an existing id."""
    text = (html / "appendix" / "interactive_figures.html").read_text(encoding="utf-8")
    assert "application/vnd.jupyter.widget-state+json" not in text
    links = re.findall(r'href="\.\./chapters/(0\d[a-z]?_\w+)\.html#([\w-]+)"', text)
    assert sorted({page[:2] for page, _ in links}) == [f"0{n}" for n in range(1, 10)], links
    for page, anchor in links:
        target = (html / "chapters" / f"{page}.html").read_text(encoding="utf-8")
        assert f'id="{anchor}"' in target, f"{page}.html has no section #{anchor}"
        start = target.index(f'id="{anchor}"')
        assert "jupyter-widgets" in target[start:] or "widget-view" in target[start:] or \
            "application/vnd.jupyter.widget-view+json" in target[start:], (page, anchor)


@pytest.mark.book
def test_widget_page_loads_the_local_widget_manager(html):
    page = _parse(html / "chapters" / "02b_encoder_decoder.html")
    text = (html / "chapters" / "02b_encoder_decoder.html").read_text(encoding="utf-8")
    assert "application/vnd.jupyter.widget-state+json" in text
    order = [next(i for i, s in enumerate(page.scripts) if name in s)
             for name in ("widgets/require.js", "widgets/widgets-shim.js",
                          "widgets/html-manager/dist/embed-amd.js")]
    assert order == sorted(order), f"widget scripts out of order: {page.scripts}"
    # ... and only there: pages without widgets do not pay for the 3.6 MB manager.
    intro = _parse(html / "intro.html")
    assert not any("embed-amd" in s or "require.js" in s for s in intro.scripts)


# The API reference ------------------------------------------------------------------------

LIBRARY = ROOT / "transformer_lib"


def public_modules() -> list[str]:
    """Every public module of the library (no part of its dotted name starts with ``_``)."""
    names = []
    for path in sorted(LIBRARY.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not any(p.startswith("_") for p in parts):
            names.append(".".join(parts))
    return names


def public_names(module: str) -> list[str]:
    """The public names a module defines at its top level (functions, classes, constants): those
    of its literal ``__all__``, else every name without a leading underscore. A name it only
    imports (a package's re-exports) is checked in the module that defines it."""
    path = ROOT / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defined, exported = [], None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.append(node.name)
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        for target in targets:
            if isinstance(target, ast.Name) and target.id == "__all__":
                try:
                    exported = set(ast.literal_eval(node.value))
                except ValueError:
                    pass  # built at import (transformer_lib.checks): its modules are checked
            elif isinstance(target, ast.Name):
                defined.append(target.id)
    return [name for name in defined if not name.startswith("_")
            and (exported is None or name in exported)]


def documented_names(page: str) -> set[str]:
    """The dotted names that have an entry on a page autodoc wrote (its anchors)."""
    return set(re.findall(r'<dt class="sig sig-object py" id="([\w.]+)"', page))


def undocumented(modules: dict[str, list[str]], documented: set[str]) -> list[str]:
    """Each ``module.name`` that has no entry on the page."""
    return [f"{module}.{name}" for module, names in modules.items() for name in names
            if f"{module}.{name}" not in documented]


def test_public_names_are_found_in_the_library():
    modules = public_modules()
    assert {"transformer_lib.attention", "transformer_lib.plotting",
            "transformer_lib.widgets.rope", "transformer_lib.checks.ch01_attention",
            "transformer_lib.variants.mla"} <= set(modules)
    assert not [m for m in modules if "._" in m]
    assert "causal_mask" in public_names("transformer_lib.attention")
    assert "DecoderConfig" in public_names("transformer_lib.decoder")  # from __all__
    assert "KVCache" not in public_names("transformer_lib.decoder")  # imported: cache's
    assert "KVCache" in public_names("transformer_lib.cache")
    assert public_names("transformer_lib.plotting") == []  # re-exports only
    assert "check_score_scale" in public_names("transformer_lib.checks.ch01_attention")


def test_undocumented_names_are_reported():
    documented = documented_names('<dt class="sig sig-object py" id="transformer_lib.plotting.'
                                  'attention.attention_heatmap">')
    modules = {"transformer_lib.plotting.attention": ["attention_heatmap", "kv_cache_mask"]}
    assert undocumented(modules, documented) == ["transformer_lib.plotting.attention.kv_cache_mask"]


@pytest.mark.book
def test_api_page_documents_every_public_name(html):
    """Every public function, class and constant of every public module has an entry on the
    API reference page, under the module that defines it: a new name without a docstring (a
    constant without its ``#:`` comment), or a new module without its ``automodule`` block,
    fails here."""
    page = (html / "appendix" / "api.html").read_text(encoding="utf-8")
    documented = documented_names(page)
    modules = {module: public_names(module) for module in public_modules()}
    assert sum(map(len, modules.values())) > 200
    missing = undocumented(modules, documented)
    assert not missing, f"not on the API page: {missing}"
    blocks = set(re.findall(r'id="module-([\w.]+)"', page))
    assert set(modules) <= blocks, f"no automodule block: {sorted(set(modules) - blocks)}"
