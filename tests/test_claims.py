"""The seed claims (C1 ... C43) are tracked by cell tags, invisible to readers.

A cell that demonstrates claim Cn carries the tag ``claim-Cn`` (several tags if it shows
several claims); no code cell says ``# claim Cn``, which readers would see. Each claim placed
in a chapter has at least one tagged code cell in its chapter that
``assert``s it, and the claims of the overview seed already shown in chapters 1, 2 and 6
(C36-C38) keep their tags. All 43 claims are placed: C1-C35 and C39-C43 by chapter, C36-C38
by their tags.
"""
from __future__ import annotations

import re

import nbformat
import pytest

from book_support import ROOT, chapter_pages

CHAPTER_PATHS = sorted((ROOT / "chapters").glob("*.ipynb"))
VALID_CLAIMS = range(1, 44)  # C1 ... C43: the seed claims of the course
CHAPTER_OF_CLAIM = {
    **{n: "01_" for n in range(1, 8)},  # softmax and scaled dot-product attention
    **{n: "02_" for n in range(8, 12)},  # the roles of Q, K and V
    **{n: "03_" for n in range(12, 15)},  # multi-head attention
    **{n: "04_" for n in range(15, 21)},  # normalisation and training stability
    **{n: "05_" for n in range(21, 26)},  # positional encodings
    **{n: "06_" for n in range(26, 31)},  # the modern decoder
    **{n: "07_" for n in range(31, 36)},  # the KV cache
    39: "09_",  # MoE changes the FFN, not attention
    40: "08_",  # tiled attention with an online softmax
    **{n: "09_" for n in range(41, 44)},  # MLA, linear attention and DeltaNet, long context
}
KEPT_CLAIMS = (36, 37, 38)  # from the overview seed, already shown in chapters 1 and 2
_TAG = re.compile(r"^claim-C(\d+)$")
_COMMENT = re.compile(r"#\s*claims?\s+C\d+", re.IGNORECASE)
_ASSERT = re.compile(r"^\s*assert\b", re.M)


def _read(path):
    return nbformat.read(path, as_version=4)


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def claim_comments(nb) -> list[str]:
    """The ``# claim Cn`` comments in the code cells of ``nb``."""
    return [f"cell {i}: {match.group(0)!r}" for i, cell in enumerate(nb.cells)
            if cell.cell_type == "code" for match in _COMMENT.finditer(cell.source)]


def bad_claim_tags(nb) -> list[str]:
    """Tags that look like claim tags but are not ``claim-Cn`` with n a seed claim."""
    bad = []
    for i, cell in enumerate(nb.cells):
        for tag in _tags(cell):
            if not tag.lower().startswith("claim"):
                continue
            match = _TAG.match(tag)
            if not match or int(match.group(1)) not in VALID_CLAIMS:
                bad.append(f"cell {i}: {tag!r}")
    return bad


def asserting_cells(nb, claim: int) -> list[int]:
    """The code cells of ``nb`` tagged ``claim-C<claim>`` that hold an ``assert``."""
    return [i for i, cell in enumerate(nb.cells)
            if cell.cell_type == "code" and f"claim-C{claim}" in _tags(cell)
            and _ASSERT.search(cell.source)]


def _chapter(prefix: str):
    paths = [p for p in CHAPTER_PATHS if p.name.startswith(prefix) and p.stem in chapter_pages()]
    assert len(paths) == 1, f"no single chapter {prefix}*.ipynb: {paths}"
    return paths[0]


@pytest.mark.parametrize("chapter", CHAPTER_PATHS, ids=lambda p: p.name)
def test_no_claim_comment_in_a_code_cell(chapter):
    found = claim_comments(_read(chapter))
    assert not found, ("claims are cell tags (claim-Cn), not comments readers see:\n"
                       + "\n".join(found))


@pytest.mark.parametrize("chapter", CHAPTER_PATHS, ids=lambda p: p.name)
def test_claim_tags_are_well_formed(chapter):
    bad = bad_claim_tags(_read(chapter))
    assert not bad, f"claim tags must be claim-C1 ... claim-C43: {bad}"


@pytest.mark.parametrize("claim", sorted(CHAPTER_OF_CLAIM), ids=lambda n: f"C{n}")
def test_each_claim_of_a_written_chapter_has_an_asserting_cell(claim):
    """On any page of the claim's chapter (a chapter of two pages: either)."""
    chapter = _chapter(CHAPTER_OF_CLAIM[claim])
    pages = [chapter.parent / f"{stem}.ipynb" for stem in chapter_pages()[chapter.stem]]
    assert any(asserting_cells(_read(page), claim) for page in pages), (
        f"no code cell of {[p.name for p in pages]} tagged claim-C{claim} holds an assert")


@pytest.mark.parametrize("claim", KEPT_CLAIMS, ids=lambda n: f"C{n}")
def test_overview_claims_keep_their_tags(claim):
    tagged = [p.name for p in CHAPTER_PATHS
              if any(f"claim-C{claim}" in _tags(c) for c in _read(p).cells)]
    assert tagged, f"no cell of the chapters is tagged claim-C{claim}"


def test_every_seed_claim_is_placed():
    assert sorted([*CHAPTER_OF_CLAIM, *KEPT_CLAIMS]) == list(VALID_CLAIMS)


def test_the_claim_checks_on_a_small_notebook():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("x = 1  # claim C3: a comment", metadata={"tags": ["claim-C3"]}),
        nbformat.v4.new_code_cell("y = 2\nassert y == 2", metadata={"tags": ["claim-C4"]}),
        nbformat.v4.new_code_cell("z = 3", metadata={"tags": ["claim-C5", "claim-C44",
                                                              "claim-c6", "claims-C7"]}),
        nbformat.v4.new_markdown_cell("assert nothing", metadata={"tags": ["claim-C8"]}),
    ]
    assert claim_comments(nb) == ["cell 0: '# claim C3'"]
    assert bad_claim_tags(nb) == ["cell 2: 'claim-C44'", "cell 2: 'claim-c6'",
                                  "cell 2: 'claims-C7'"]
    assert asserting_cells(nb, 4) == [1]
    assert asserting_cells(nb, 3) == [] and asserting_cells(nb, 5) == []
    assert asserting_cells(nb, 8) == []  # a Markdown cell asserts nothing
