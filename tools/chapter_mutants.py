"""Plant known bugs in the library and show which chapter cell catches each one.

    python tools/chapter_mutants.py [NAME ...] [--list]

A chapter's asserts are evidence only if they fail when the library is wrong. Each mutant
below is one bug, written as a text edit of one library file (the bugs a reviewer planted,
and the classic slips of each mechanism). For each mutant the script copies the library
into a scratch folder, applies the edit, runs the pages named for it against that copy
(every other page is left alone) and prints the first cell that fails, its assert line and
its message. A mutant that every named page survives is reported as ``SURVIVED`` and the
script exits 1. Nothing in the repository is changed. ``tests/test_tools.py`` checks that
every edit still applies to the current source, so this list cannot silently go stale.

It runs a few pages, each about half a minute, so it is a tool, not part of ``make test``.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "transformer_lib"


@dataclass(frozen=True)
class Mutant:
    """One planted bug: replace ``old`` by ``new`` in ``file``; ``pages`` must catch it."""

    name: str
    what: str  # the bug, in words
    file: str  # relative to transformer_lib/
    old: str
    new: str
    pages: tuple[str, ...]  # chapter notebooks (stems) expected to fail


MUTANTS = (
    Mutant(
        "mask-top-left", "the causal mask aligned top-left (the cached prefix forgotten)",
        "attention.py",
        "rows = torch.arange(T, device=device)[:, None] + (S - T)",
        "rows = torch.arange(T, device=device)[:, None]",
        ("00_setup",)),
    Mutant(
        "mask-strict-diagonal", "the causal mask hides each query's own position",
        "attention.py",
        "return cols <= rows  # (T, S)",
        "return cols < rows  # (T, S)",
        ("01b_masks_and_cost", "03_multi_head")),
    Mutant(
        "merge-without-transpose", "heads merged by a reshape without the transpose",
        "attention.py",
        "out = out.transpose(1, 2).reshape(B, T, C)",
        "out = out.reshape(B, T, C)",
        ("02_qkv_roles",)),
    Mutant(
        "no-empty-row-guard", "a query with no visible key keeps the NaN of softmax(-inf, …)",
        "attention.py",
        "weights = zero_rows_without_keys(weights, mask, x.shape[-1])",
        "pass",
        ("01b_masks_and_cost", "07b_serving")),
    Mutant(
        "softmax-by-hand", "attention's softmax written out, so backward keeps more tensors",
        "attention.py",
        "weights = torch.softmax(x, dim=-1)",
        "e = torch.exp(x - x.amax(dim=-1, keepdim=True)); weights = e / e.sum(-1, keepdim=True)",
        ("01b_masks_and_cost",)),
    Mutant(
        "rmsnorm-eps-outside-root", "RMSNorm divides by sqrt(mean square) + ε",
        "norms.py",
        "return (h * torch.rsqrt(mean_square + eps) * weight).to(x.dtype)",
        "return (h / (mean_square.sqrt() + eps) * weight).to(x.dtype)",
        ("04_normalisation",)),
    Mutant(
        "rmsnorm-no-upcast", "RMSNorm squares float16 inputs in float16",
        "norms.py",
        "h = x.to(compute_dtype(x.dtype))  # fp16/bf16 -> fp32; fp32 and fp64 stay\n"
        "    mean_square",
        "h = x\n    mean_square",
        ("04_normalisation",)),
    Mutant(
        "converter-default-theta-eps",
        "the Llama converter ignores rope_theta and rms_norm_eps (keeps our defaults)",
        "convert.py",
        "rope_theta=_rope_theta(cfg),\n        norm_eps=cfg.rms_norm_eps,",
        "",
        ("06b_testing_and_sampling",)),
    Mutant(
        "flash-no-causal-skip", "tiled attention computes the causal tiles above the diagonal",
        "flash.py",
        "first = max(start - self.offset, 0) if self.causal else 0",
        "first = 0",
        ("08_fast_attention",)),
    Mutant(
        "mla-absorb-is-explicit", "MLA's absorbed decoding routed through the explicit path",
        "variants/mla.py",
        "attend = self._attend_absorbed if absorb else self._attend_explicit",
        "attend = self._attend_explicit",
        ("09_attention_variants",)),
)

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def apply(mutant: Mutant, library: Path) -> None:
    """Edit ``library``'s copy of the mutant's file; the edit must match exactly once."""
    path = library / mutant.file
    text = path.read_text(encoding="utf-8")
    count = text.count(mutant.old)
    if count != 1:
        raise ValueError(f"mutant {mutant.name}: {mutant.old!r} occurs {count} times in "
                         f"{mutant.file}, expected once")
    path.write_text(text.replace(mutant.old, mutant.new), encoding="utf-8")


def first_failure(page: str, library_parent: Path) -> dict | None:
    """Run ``chapters/<page>.ipynb`` with the library imported from ``library_parent``.

    Returns None when every cell runs, else the failing cell's id, the source line the
    traceback points at, and the error's name and message.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(ROOT / "chapters" / f"{page}.ipynb", as_version=4)
    env = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(library_parent) + (os.pathsep + env if env else "")
    try:
        client = NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(ROOT / "chapters")}})
        try:
            client.execute()
        except CellExecutionError:
            pass
    finally:
        if env is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = env
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                lines = [ANSI.sub("", line) for line in out.get("traceback", [])]
                pointed = [m.group(1).strip() for line in lines
                           for m in re.finditer(r"^-+> *\d+ (.*)$", line, re.M)]
                return {"cell": cell.get("id"), "line": pointed[0] if pointed else "",
                        "error": f"{out['ename']}: {ANSI.sub('', out['evalue'])}"}
    return None


def run(mutant: Mutant) -> list[tuple[str, dict | None, float]]:
    """The first failure of each of the mutant's pages, with the seconds it took."""
    results = []
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as scratch:
        library = Path(scratch) / "transformer_lib"
        shutil.copytree(LIBRARY, library, ignore=shutil.ignore_patterns("__pycache__"))
        apply(mutant, library)
        for page in mutant.pages:
            start = time.perf_counter()
            failure = first_failure(page, Path(scratch))
            results.append((page, failure, time.perf_counter() - start))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    args = parser.parse_args(argv)
    known = {m.name: m for m in MUTANTS}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        raise SystemExit(f"unknown mutants {unknown}; known: {sorted(known)}")
    chosen = [known[n] for n in args.names] or list(MUTANTS)
    if args.list:
        for m in chosen:
            print(f"{m.name:30} {', '.join(m.pages):40} {m.what}")
        return 0
    survived = 0
    for mutant in chosen:
        print(f"## {mutant.name}: {mutant.what}", flush=True)
        for page, failure, seconds in run(mutant):
            if failure is None:
                survived += 1
                print(f"- {page}: SURVIVED (every cell ran, {seconds:.0f} s)")
            else:
                print(f"- {page}: cell `{failure['cell']}` fails at `{failure['line']}`"
                      f" ({seconds:.0f} s)\n  {failure['error'][:400]}", flush=True)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
