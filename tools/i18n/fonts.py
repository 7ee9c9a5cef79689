"""Write the subset fonts of the book's languages: a font cut down to the characters shown.

    python tools/i18n fonts [--language CODE] [--package PATH]

A language whose script the readers' systems may lack a font for gives ``script`` and
``font`` in its entry of ``book_languages`` (``_config.yml``). Its edition's font
(``font.file``) then holds exactly the characters of that script in its translations (every
translated message in ``locales/<code>``) and in its termbase's page; ``_assets/book.css``
puts it after the systems' own fonts for the script, so it is fetched only where none of them
is installed, and every page of the edition preloads it (``_ext/i18n_editions.py``). Run this
after translating: ``tests/test_i18n.py`` fails until the font matches the text.

A ``termbase`` (the glossary's column of the language's terms, shown in the source edition
too) gets its own font (``termbase.font``): exactly the script's characters of the glossary,
about 15 KB for Chinese; ``_assets/book.css`` applies it to the glossary's column. Run this
after adding or changing a term: ``tests/test_glossary_font.py`` fails until you do.

The source is one file of an npm package (``font.package``, ``font.source``); for Chinese,
``@fontsource/noto-sans-sc``'s ``files/noto-sans-sc-chinese-simplified-400-normal.woff``, the
~7,900 characters of Noto Sans SC's simplified-Chinese subset, regular weight (SIL Open Font
License 1.1). ``--package`` takes that package as a ``.tgz`` (``npm pack <package>``) or as an
unpacked folder; without it the script runs ``npm pack`` itself in a temporary folder. The
package's licence file is written to ``font.licence``.

The fonts are WOFF 1 (zlib): fontTools reads and writes it with no module beyond itself, where
WOFF2 would need ``brotli``. The output depends only on the source font and the text (the
source's timestamp is kept), so running the script twice gives the same bytes.
"""
from __future__ import annotations

import io
import subprocess
import tarfile
import tempfile
from pathlib import Path

from fontTools import subset
from fontTools.ttLib import TTFont

from i18n.languages import ROOT, Language, translations


def edition_characters(language: Language) -> str:
    """The distinct characters of the language's script that its edition shows: its
    translations and its termbase's page (kept as it is in the translation), in code-point
    order."""
    from babel.messages.pofile import read_po

    text = []
    if language.termbase:
        text.append((ROOT / language.termbase.page).read_text(encoding="utf-8"))
    for path in sorted(language.catalogs.rglob("*.po")):
        with path.open("rb") as f:
            text += [m.string for m in read_po(f) if m.id and m.string and not m.fuzzy]
    return language.in_script("".join(text))


def termbase_characters(language: Language) -> str:
    """The distinct characters of the language's script on its termbase's page."""
    return language.in_script((ROOT / language.termbase.page).read_text(encoding="utf-8"))


def subset_font(source: Path | io.BytesIO, characters: str) -> bytes:
    """``source`` (any format fontTools reads) cut down to ``characters``, as WOFF bytes.

    Raises:
        ValueError: naming the characters the source font does not have.
    """
    font = TTFont(source, recalcTimestamp=False)
    cmap = font.getBestCmap()
    missing = [ch for ch in characters if ord(ch) not in cmap]
    if missing:
        raise ValueError(f"the source font lacks {''.join(missing)!r} "
                         f"({', '.join(f'U+{ord(ch):04X}' for ch in missing)})")
    options = subset.Options()
    options.layout_features = []  # no ligatures or alternates: one glyph per character
    options.name_IDs = ["*"]  # keep the copyright and licence records
    options.drop_tables += ["STAT", "vhea", "vmtx"]  # no vertical text here
    subsetter = subset.Subsetter(options)
    subsetter.populate(text=characters)
    subsetter.subset(font)
    font.flavor = "woff"
    out = io.BytesIO()
    font.save(out)
    return out.getvalue()


def _read_package(package: Path, source_file: str) -> tuple[bytes, bytes]:
    """The source font and the licence file of the package (a .tgz or an unpacked folder)."""
    if package.is_dir():
        return (package / source_file).read_bytes(), (package / "LICENSE").read_bytes()
    with tarfile.open(package) as tar:  # npm pack: every member under package/
        read = lambda name: tar.extractfile(f"package/{name}").read()  # noqa: E731
        return read(source_file), read("LICENSE")


def _npm_pack(name: str, folder: Path) -> Path:
    result = subprocess.run(["npm", "pack", "--silent", name], cwd=folder, check=True,
                            capture_output=True, text=True)
    return folder / result.stdout.strip().splitlines()[-1]


def targets(language: Language) -> list[tuple[Path, str]]:
    """The fonts of a language, each with the characters it must hold."""
    found = [(ROOT / language.font.file, edition_characters(language))]
    if language.termbase:
        found.insert(0, (ROOT / language.termbase.font, termbase_characters(language)))
    return found


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="tools/i18n fonts",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--language", help="one language's code (default: every language "
                                           "with a font)")
    parser.add_argument("--package", type=Path,
                        help="its font's package as a .tgz or a folder (default: npm pack it)")
    args = parser.parse_args(argv)
    chosen = [language for language in translations() if language.font
              and args.language in (None, language.code)]
    if args.package and len(chosen) != 1:
        parser.error(f"--package is one language's: give --language, one of "
                     f"{[language.code for language in chosen]}")
    for language in chosen:
        with tempfile.TemporaryDirectory() as tmp:
            package = args.package or _npm_pack(language.font.package, Path(tmp))
            source, licence = _read_package(package, language.font.source)
        (ROOT / language.font.licence).parent.mkdir(parents=True, exist_ok=True)
        (ROOT / language.font.licence).write_bytes(licence)
        for path, characters in targets(language):
            font = subset_font(io.BytesIO(source), characters)
            path.write_bytes(font)
            print(f"{path.relative_to(ROOT)}: {len(characters)} characters, "
                  f"{len(font) / 1024:.1f} KiB")
    return 0
