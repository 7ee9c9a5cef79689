"""Write the book's Chinese fonts: Noto Sans SC cut down to the characters each one shows.

    python tools/make_glossary_font.py [--package PATH]

The glossary (``appendix/glossary.md``) gives the Chinese term for each English one. So that
its Chinese column shows on a machine without a Chinese font, the book serves a font for it:
a subset of Noto Sans SC (SIL Open Font License 1.1) holding exactly the CJK characters of
the glossary, about 15 KB instead of megabytes. ``_assets/book.css`` applies it to the
glossary's second column. Run this script after adding or changing a Chinese term:
``tests/test_glossary_font.py`` fails until the font matches the glossary.

The source is the npm package ``@fontsource/noto-sans-sc`` (``PACKAGE``): its file
``files/noto-sans-sc-chinese-simplified-400-normal.woff`` holds the ~7,900 characters of the
font's simplified-Chinese subset, regular weight. ``--package`` takes that package as a
``.tgz`` (``npm pack @fontsource/noto-sans-sc@<version>``) or as an unpacked folder; without
it the script runs ``npm pack`` itself in a temporary folder.

The Chinese edition gets the same treatment: ``_assets/fonts/book-zh.woff`` holds exactly the
CJK characters of its translations (every translated message in ``locales/zh_CN``) and of the
glossary, and ``_assets/book.css`` puts it after the systems' own Chinese fonts, so it is
fetched only where none of them is installed. Run this script after translating, too.

Writes ``_assets/fonts/glossary-zh.woff``, ``_assets/fonts/book-zh.woff`` and
``_assets/fonts/OFL.txt`` (the package's licence file). The fonts are WOFF 1 (zlib): fontTools
reads and writes it with no module beyond itself, where WOFF2 would need ``brotli``. The
output depends only on the source font and the text (the source's timestamp is kept), so
running the script twice gives the same bytes.
"""
from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from fontTools import subset
from fontTools.ttLib import TTFont

ROOT = Path(__file__).resolve().parent.parent
GLOSSARY = ROOT / "appendix" / "glossary.md"
FONTS = ROOT / "_assets" / "fonts"
FONT = FONTS / "glossary-zh.woff"
EDITION_FONT = FONTS / "book-zh.woff"  # the Chinese edition's text
CATALOGS = ROOT / "locales" / "zh_CN" / "LC_MESSAGES"
LICENCE = FONTS / "OFL.txt"

PACKAGE = "@fontsource/noto-sans-sc@5.3.0"
SOURCE_FILE = "files/noto-sans-sc-chinese-simplified-400-normal.woff"  # inside the package

# Code points that count as CJK here; _assets/book.css gives the font this unicode-range.
CJK_RANGES = [
    (0x2E80, 0x2FDF),  # radicals
    (0x3000, 0x303F),  # CJK symbols and punctuation
    (0x3400, 0x4DBF),  # unified ideographs, extension A
    (0x4E00, 0x9FFF),  # unified ideographs
    (0xF900, 0xFAFF),  # compatibility ideographs
    (0xFF00, 0xFFEF),  # full-width forms (Chinese punctuation: ，：；（）)
]


def cjk_characters(text: str) -> str:
    """The distinct CJK characters of ``text``, in code-point order."""
    return "".join(sorted({ch for ch in text
                           if any(lo <= ord(ch) <= hi for lo, hi in CJK_RANGES)}))


def edition_characters(catalogs: Path = CATALOGS, glossary: Path = GLOSSARY) -> str:
    """The distinct CJK characters the Chinese edition shows: its translations and the
    glossary's Chinese column (kept as it is in the translation), in code-point order."""
    from babel.messages.pofile import read_po

    text = [glossary.read_text(encoding="utf-8")]
    for path in sorted(catalogs.rglob("*.po")):
        with path.open("rb") as f:
            text += [m.string for m in read_po(f) if m.id and m.string and not m.fuzzy]
    return cjk_characters("".join(text))


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


def _read_package(package: Path) -> tuple[bytes, bytes]:
    """The source font and the licence file of the package (a .tgz or an unpacked folder)."""
    if package.is_dir():
        return (package / SOURCE_FILE).read_bytes(), (package / "LICENSE").read_bytes()
    with tarfile.open(package) as tar:  # npm pack: every member under package/
        read = lambda name: tar.extractfile(f"package/{name}").read()  # noqa: E731
        return read(SOURCE_FILE), read("LICENSE")


def _npm_pack(folder: Path) -> Path:
    result = subprocess.run(["npm", "pack", "--silent", PACKAGE], cwd=folder, check=True,
                            capture_output=True, text=True)
    return folder / result.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", type=Path,
                        help=f"{PACKAGE} as a .tgz or a folder (default: npm pack it now)")
    args = parser.parse_args(argv)
    characters = cjk_characters(GLOSSARY.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as tmp:
        package = args.package or _npm_pack(Path(tmp))
        source, licence = _read_package(package)
    FONTS.mkdir(parents=True, exist_ok=True)
    LICENCE.write_bytes(licence)
    for path, chars in ((FONT, characters), (EDITION_FONT, edition_characters())):
        font = subset_font(io.BytesIO(source), chars)
        path.write_bytes(font)
        print(f"{path.relative_to(ROOT)}: {len(chars)} characters, {len(font) / 1024:.1f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
