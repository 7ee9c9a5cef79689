"""Releases of the course: one version everywhere, the release text, the handouts' zip.

    python tools/release.py check [--tag v0.4.0]   # exit 1 and say what disagrees
    python tools/release.py notes v0.4.0           # the CHANGELOG section of 0.4.0
    python tools/release.py handouts v0.4.0 dist   # dist/transformer_lib-0.4.0-exercises.zip
    python tools/release.py home OWNER/REPO        # warn if repository.url names another one
    python tools/release.py pages-url              # the book's address, from repository.url

One version, in four places that ``check`` compares: ``[project].version`` in
``pyproject.toml``; the newest released section of ``CHANGELOG.md`` (its first ``## X.Y.Z``
heading; changes not released yet go under ``## Unreleased``, above it); the student copies
in ``exercises/``, whose setup cell installs ``git+<repository.url>@v<version>`` and whose
metadata names the version; and, for a release, the tag ``v<version>``. ``check`` also
compares ``html.baseurl`` in ``_config.yml`` with the GitHub Pages address of
``repository.url``, the one line a fork changes.

The release workflow (``.github/workflows/release.yml``) runs ``check --tag``, then
``handouts`` and ``notes``: the release's text is the version's CHANGELOG section, and its
handouts are the student copies in a zip with a fixed timestamp (the same copies give the same
bytes).
"""
from __future__ import annotations

import argparse
import re
import sys
import tomllib
import zipfile
from pathlib import Path

import nbformat
import yaml

from setup_cell import is_setup_cell, pages_url, repository, setup_cell_source

ROOT = Path(__file__).resolve().parent.parent
UNRELEASED = "Unreleased"
_HEADING = re.compile(r"^## (.+?)\s*$", re.M)
_VERSION = re.compile(r"\d+\.\d+\.\d+")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can hold: the same bytes every time


def project_version(root: Path = ROOT) -> str:
    """``[project].version`` of ``root/pyproject.toml``."""
    text = (root / "pyproject.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)["project"]["version"]


def version_of_tag(tag: str) -> str:
    """``"0.4.0"`` for the tag ``"v0.4.0"``.

    Raises:
        ValueError: the tag is not ``v`` followed by a version ``X.Y.Z``."""
    if not re.fullmatch(rf"v{_VERSION.pattern}", tag):
        raise ValueError(f"a release tag is v<major>.<minor>.<patch>, got {tag!r}")
    return tag[1:]


def changelog_sections(text: str) -> list[tuple[str, str]]:
    """``(heading, body)`` of every ``## `` section of a changelog, in file order."""
    found = list(_HEADING.finditer(text))
    ends = [m.start() for m in found[1:]] + [len(text)]
    return [(m.group(1), text[m.end():end].strip()) for m, end in zip(found, ends)]


def released_version(text: str) -> str | None:
    """The newest released version of a changelog: its first ``## X.Y.Z`` heading."""
    return next((h for h, _ in changelog_sections(text) if _VERSION.fullmatch(h)), None)


def changelog_problems(text: str) -> list[str]:
    """What is wrong with the changelog's headings: each is a version ``X.Y.Z``, or
    ``Unreleased`` above all of them; versions newest first, none twice."""
    headings = [h for h, _ in changelog_sections(text)]
    problems = [f"CHANGELOG.md: heading '## {h}' is neither a version X.Y.Z nor '{UNRELEASED}'"
                for h in headings if h != UNRELEASED and not _VERSION.fullmatch(h)]
    if UNRELEASED in headings[1:]:
        problems.append(f"CHANGELOG.md: '## {UNRELEASED}' must be the first section")
    versions = [tuple(map(int, h.split("."))) for h in headings if _VERSION.fullmatch(h)]
    if versions != sorted(set(versions), reverse=True):
        problems.append("CHANGELOG.md: the versions must be newest first, each once")
    return problems


def release_notes(text: str, version: str) -> str:
    """The body of the changelog section ``## <version>``: the release's text.

    Raises:
        ValueError: the changelog has no such section, or it is empty."""
    for heading, body in changelog_sections(text):
        if heading == version:
            if not body:
                raise ValueError(f"CHANGELOG.md: the section '## {version}' is empty")
            return body + "\n"
    raise ValueError(f"CHANGELOG.md has no section '## {version}': write it before tagging")


def student_copies(root: Path = ROOT) -> list[Path]:
    """The student notebooks, ``root/exercises/*.ipynb``, sorted."""
    return sorted((root / "exercises").glob("*.ipynb"))


def copy_problems(path: Path, version: str, expected_setup: str) -> list[str]:
    """What in a student copy disagrees with ``version``: the version in its metadata, or a
    setup cell that does not install the tag ``v<version>`` of the repository."""
    nb = nbformat.read(path, as_version=4)
    name = f"exercises/{path.name}"
    problems = []
    stamped = nb.metadata.get("transformer_lib", {}).get("version")
    if stamped != version:
        problems.append(f"{name}: made for version {stamped}, not {version} (make student)")
    setup = [cell.source for cell in nb.cells if is_setup_cell(cell)]
    if setup != [expected_setup]:
        pins = sorted(set(re.findall(r"git\+\S+?@[\w.-]+", "\n".join(setup))))
        problems.append(f"{name}: its setup cell installs {pins or 'nothing'}, not "
                        f"the tag v{version} of repository.url (make student)")
    return problems


def version_problems(root: Path = ROOT, tag: str | None = None) -> list[str]:
    """Every disagreement between the version's places (and ``html.baseurl``); empty when
    ``root`` is ready to be released as ``tag`` (or as its own version, without a tag)."""
    version = project_version(root)
    problems = []
    if tag is not None and version_of_tag(tag) != version:
        problems.append(f"the tag {tag} is not v{version}, the version of pyproject.toml")
    changelog = (root / "CHANGELOG.md").read_text(encoding="utf-8")
    problems += changelog_problems(changelog)
    released = released_version(changelog)
    if released != version:
        problems.append(f"CHANGELOG.md: the newest released section is {released}, "
                        f"pyproject.toml says {version}")
    config_path = root / "_config.yml"
    expected_setup = setup_cell_source(config_path, ref=f"v{version}")
    copies = student_copies(root)
    if not copies:
        problems.append("exercises/ holds no student copies (make student)")
    for path in copies:
        problems += copy_problems(path, version, expected_setup)
    url, _ = repository(config_path)
    baseurl = (yaml.safe_load(config_path.read_text(encoding="utf-8")).get("html") or {}).get(
        "baseurl")
    if baseurl != pages_url(url):
        problems.append(f"_config.yml: html.baseurl is {baseurl!r}; the Pages address of "
                        f"repository.url is {pages_url(url)!r}")
    return problems


def handouts_name(version: str) -> str:
    return f"transformer_lib-{version}-exercises.zip"


def write_handouts(root: Path, tag: str, out_dir: Path) -> Path:
    """Zip the student copies of ``root`` as ``out_dir/transformer_lib-<version>-exercises.zip``
    (folder ``exercises-<tag>/`` inside), after checking each installs ``tag``.

    Returns:
        The zip's path.

    Raises:
        ValueError: a copy disagrees with the tag, or there is none."""
    version = version_of_tag(tag)
    expected_setup = setup_cell_source(root / "_config.yml", ref=tag)
    copies = student_copies(root)
    problems = [p for path in copies for p in copy_problems(path, version, expected_setup)]
    if problems or not copies:
        raise ValueError("; ".join(problems) or "exercises/ holds no student copies")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / handouts_name(version)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in copies:
            info = zipfile.ZipInfo(f"exercises-{tag}/{path.name}", date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16  # -rw-r--r--
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes())
    return target


def home_warning(url: str, repository_name: str) -> str | None:
    """A GitHub Actions warning when ``repository.url`` (``url``) is not the repository
    ``owner/name`` the workflow runs in (a fork that has not set the line yet), else None."""
    if url.lower().rstrip("/") == f"https://github.com/{repository_name}".lower():
        return None
    return (f"::warning title=repository.url::_config.yml names {url}, but this is "
            f"{repository_name}: the book's buttons, setup cells and handouts point there. "
            "Set repository.url and html.baseurl, run make setup-cells student, commit.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="exit 1 if the version's places disagree")
    check.add_argument("--tag", help="the release's tag, v<version>")
    notes = commands.add_parser("notes", help="print the version's CHANGELOG section")
    notes.add_argument("tag")
    handouts = commands.add_parser("handouts", help="zip the student copies")
    handouts.add_argument("tag")
    handouts.add_argument("out_dir", type=Path)
    home = commands.add_parser("home", help="warn if repository.url is another repository")
    home.add_argument("repository", help="owner/name, e.g. $GITHUB_REPOSITORY")
    commands.add_parser("pages-url", help="print the book's GitHub Pages address")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            problems = version_problems(ROOT, args.tag)
            for problem in problems:
                print(problem, file=sys.stderr)
            return 1 if problems else 0
        if args.command == "notes":
            changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
            sys.stdout.write(release_notes(changelog, version_of_tag(args.tag)))
        elif args.command == "handouts":
            print(write_handouts(ROOT, args.tag, args.out_dir))
        elif args.command == "home":
            warning = home_warning(repository()[0], args.repository)
            print(warning or f"repository.url is {args.repository}")
        else:
            print(pages_url(repository()[0]))
    except ValueError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
