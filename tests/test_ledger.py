"""The equality ledger (tests/ledger_plugin.py, appendix/ledger.json): its rows are exactly the
marked tests, its margins are what the plugin says, and its guards fail what they must."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ledger_plugin
from ledger_plugin import LEDGER_FILE, allowed, load

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _pytest(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "-p", "no:xdist", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)


def test_the_ledger_is_complete_and_consistent():
    data = load()
    rows = data["rows"]
    assert rows, "appendix/ledger.json has no rows: run `make ledger`"
    keys = [(r["test"], r["comparison"]) for r in rows]
    assert len(keys) == len(set(keys)), "a comparison is recorded twice"
    for r in rows:
        assert set(r) == {"test", "comparison", "reference", "dtype", "max_difference",
                          "tolerance"}, r
        assert math.isfinite(r["max_difference"]) and 0 <= r["max_difference"] <= r["tolerance"]
    score = data[ledger_plugin.PLANTED]
    assert score is not None and score["planted"] >= 20
    assert score["killed"] == score["planted"] == len(score["mutants"])


def test_every_row_is_a_marked_test_and_every_marked_test_has_rows():
    """The node ids of the rows and of the tests marked `equality` are the same set (the tests
    collected, not run: a test skipped here for want of a reference still needs its row).
    Collected: the files the rows name, and every test file that marks a test."""
    data = load()
    recorded = {r["test"] for r in data["rows"]} | {data[ledger_plugin.PLANTED]["test"]}
    files = {test.split("::")[0] for test in recorded}
    files |= {f"tests/{path.name}" for path in TESTS.glob("test_*.py")
              if "pytest.mark.equality" in path.read_text(encoding="utf-8")}
    found = _pytest("--collect-only", "-q", "-m", "equality", *sorted(files), cwd=ROOT)
    assert found.returncode == 0, found.stdout[-3000:] + found.stderr[-3000:]
    marked = {line for line in found.stdout.splitlines() if "::" in line}
    assert not marked - recorded, f"marked tests with no row (run `make ledger`): {sorted(marked - recorded)}"
    assert not recorded - marked, f"rows of no marked test (run `make ledger`): {sorted(recorded - marked)}"


@pytest.mark.parametrize("committed, dtype, ok, too_much", [
    (1e-16, "float64", 3e-15, 5e-15),  # a few ulps above a tiny committed value
    (1e-13, "float64", 4e-13, 5e-13),  # four times the committed value
    (0.0, "float32", 1.9e-6, 2e-6),  # 16 · 2^-23 above an exact fp32 match
    (2e-6, "float32", 8e-6, 9e-6),
    (0.0, "int64", 0.0, 1.0),  # token ids: equal or not
])
def test_what_a_committed_row_allows(committed, dtype, ok, too_much):
    assert ok <= allowed(committed, dtype) < too_much


def test_the_guards_fail_what_they_must(tmp_path):
    """In a project of its own: a row that got worse, a comparison with no row, a marked
    test that records nothing or does not ask for the fixture, an unmarked test that calls a
    PyTorch reference itself, and one that loads a reference library, each fail; the good
    test passes. Then a refresh writes the file, and the same run passes."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent('''
        from ledger_plugin import (ledger, pytest_configure, pytest_runtest_call,
                                   pytest_runtest_makereport, pytest_runtest_setup,
                                   pytest_sessionfinish, reference_loaded)

        def require(package):
            reference_loaded(package)
            return __import__(package)
        '''))
    (tmp_path / "test_cases.py").write_text(textwrap.dedent('''
        import pytest
        import torch
        import torch.nn.functional as F
        from conftest import require

        @pytest.mark.equality
        def test_good(ledger):
            ledger.check("same", "itself", torch.ones(3), torch.ones(3), tol=1e-12)

        @pytest.mark.equality
        def test_worse(ledger):
            ledger.check("worse", "itself", torch.ones(3), torch.ones(3) + 1e-4, tol=1e-3)

        @pytest.mark.equality
        def test_new(ledger):
            ledger.check("not in the file", "itself", torch.ones(3), torch.ones(3), tol=1e-12)

        @pytest.mark.equality
        def test_records_nothing(ledger):
            pass

        @pytest.mark.equality
        def test_no_fixture():
            pass

        def test_unmarked_sdpa():
            q = torch.randn(2, 3, 4)
            assert torch.allclose(F.scaled_dot_product_attention(q, q, q), q, atol=10)

        def test_unmarked_require():
            require("math")
        '''))
    committed = {"rows": [
        {"test": "test_cases.py::test_good", "comparison": "same", "reference": "itself",
         "dtype": "float32", "max_difference": 0.0, "tolerance": 1e-12},
        {"test": "test_cases.py::test_worse", "comparison": "worse", "reference": "itself",
         "dtype": "float32", "max_difference": 1e-8, "tolerance": 1e-3}],
        "planted_bugs": None}
    file = tmp_path / "ledger.json"
    file.write_text(json.dumps(committed))
    env = {"LEDGER_FILE": str(file), "PYTHONPATH": os.pathsep.join(
        [str(TESTS), os.environ.get("PYTHONPATH", "")]), "LEDGER_WRITE": ""}
    run = _pytest("-q", "-rf", "test_cases.py", cwd=tmp_path, env=env)
    out = run.stdout
    assert "5 failed, 1 passed" in out and "1 error" in out, out[-4000:]  # error: at setup
    for fragment in ("exceeds the committed", "has no row in ledger.json",
                     "recorded no row", "does not use the ledger fixture",
                     "but is not marked equality", "require('math')"):
        assert fragment in out, (fragment, out[-4000:])
    # A refresh of the marked tests that pass writes exactly their rows.
    good = ["test_cases.py::test_good", "test_cases.py::test_worse",
            "test_cases.py::test_new"]
    refresh = _pytest("-q", *good, cwd=tmp_path, env={**env, "LEDGER_WRITE": "1"})
    assert refresh.returncode == 0, refresh.stdout[-3000:]
    rows = json.loads(file.read_text())["rows"]
    assert [r["test"] for r in rows] == sorted(good)
    assert _pytest("-q", *good, cwd=tmp_path, env=env).returncode == 0


def test_the_ledger_file_is_the_books():
    assert LEDGER_FILE == ROOT / "appendix" / "ledger.json"
    assert (ROOT / "appendix" / "ledger.ipynb").exists()
