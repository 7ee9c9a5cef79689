"""The equality ledger: every proof of equality the tests make, one row each, in
``appendix/ledger.json`` (rendered by the book's appendix page ``appendix/ledger.ipynb``).

A test that compares the library with an independent implementation (Hugging Face, a
PyTorch module or kernel, a formula written out in the test, autograd) is marked
``@pytest.mark.equality`` and makes its comparisons through the ``ledger`` fixture::

    @pytest.mark.equality
    def test_rmsnorm_matches_torch(ledger):
        ledger.check("RMSNorm", ledger.torch("nn.RMSNorm"), ours(x), ref(x), tol=1e-6)

``check`` measures the largest absolute difference, asserts it is within the tolerance, and
then holds it against the committed row of the same test and comparison:

* ``make ledger`` (``LEDGER_WRITE=1``, one process) runs the marked tests and rewrites the
  file from what they measured, with the planted-bug score of ``tests/test_planted_bugs.py``.
  Only a run in which every selected test passed writes anything.
* Every other run reads the file. A comparison fails when it has no committed row, or when
  its measured difference exceeds what the committed one allows (:func:`allowed`): an
  equality that got worse is a regression even while it is still within the tolerance.

What cannot drop a row silently: a marked test that records nothing fails; a test that asks
for ``ledger`` must be marked and a marked test must ask for it; a test that is not marked
and loads a reference library (``require``) or calls a PyTorch reference
(:data:`REFERENCES`) from its own body fails; and ``tests/test_ledger.py`` checks that the
rows and the marked tests are the same set, both ways.
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

# LEDGER_FILE: another file, for the tests of this plugin (tests/test_ledger.py).
LEDGER_FILE = Path(os.environ.get(
    "LEDGER_FILE", Path(__file__).resolve().parent.parent / "appendix" / "ledger.json"))
WRITE = os.environ.get("LEDGER_WRITE") == "1"  # set by `make ledger`
PLANTED = "planted_bugs"  # the key of the planted-bug score in the file

# A committed row allows a measured difference of max(FACTOR · committed, committed +
# ULPS · eps(dtype)). Another machine, BLAS or PyTorch build sums in another order: its
# rounding differs by a small factor, never by orders of magnitude, and a row measured as 0
# here may be a few units in the last place there. A real regression moves the difference by
# orders of magnitude: a wrong formula to ~1e-2, an fp64 path that passes through fp32 from
# ~1e-16 to ~1e-8.
FACTOR = 4.0
ULPS = 16


def allowed(committed: float, dtype: str) -> float:
    """The largest measured difference a committed row of ``dtype`` accepts."""
    kind = getattr(torch, dtype, None)
    eps = torch.finfo(kind).eps if isinstance(kind, torch.dtype) and kind.is_floating_point else 0.0
    return max(FACTOR * committed, committed + ULPS * eps)


def max_difference(got, expected) -> float:
    """max |got - expected| over every entry, computed in fp64 (0 for empty tensors)."""
    got, expected = torch.as_tensor(got), torch.as_tensor(expected)
    if got.shape != expected.shape:
        raise AssertionError(f"shapes differ: {tuple(got.shape)} and {tuple(expected.shape)}")
    if got.numel() == 0:
        return 0.0
    diff = (got.detach().cpu().double() - expected.detach().cpu().double()).abs().max().item()
    return math.inf if math.isnan(diff) else diff


def _dtype_name(x) -> str:
    return str(torch.as_tensor(x).dtype).removeprefix("torch.")


def load() -> dict:
    """The committed ledger: ``{"rows": [...], "planted_bugs": {...}}``."""
    if not LEDGER_FILE.exists():
        return {"rows": [], PLANTED: None}
    return json.loads(LEDGER_FILE.read_text(encoding="utf-8"))


class _State:
    """Per process: the committed rows, and what this run measured."""

    def __init__(self):
        committed = load()
        self.committed = {(r["test"], r["comparison"]): r for r in committed["rows"]}
        self.committed_score = committed.get(PLANTED)
        self.rows: list[dict] = []
        self.score: dict | None = None
        self.recorded: dict[str, int] = {}  # node id -> rows recorded by that test


_state: _State | None = None


def _get_state() -> _State:
    global _state
    if _state is None:
        _state = _State()
    return _state


class Ledger:
    """What a marked test records its comparisons with (the ``ledger`` fixture)."""

    def __init__(self, nodeid: str):
        self.nodeid = nodeid
        self._comparisons: set[str] = set()

    @staticmethod
    def hf(name: str) -> str:
        """"transformers <version> <name>": a Hugging Face model or layer."""
        import transformers

        return f"transformers {transformers.__version__} {name}"

    @staticmethod
    def torch(name: str) -> str:
        """"torch <version> <name>": a PyTorch module, function or kernel."""
        return f"torch {torch.__version__.split('+')[0]} {name}"

    def check(self, comparison: str, reference: str, got, expected, tol: float) -> float:
        """Assert max |got - expected| <= ``tol`` and record it as the row ``comparison``.

        Args:
            comparison: what is compared, short ("decoder logits, GQA 4/2, sdpa").
            reference: the independent implementation (:meth:`hf`, :meth:`torch`, or words
                such as "the formula written out in fp64").
            got, expected: tensors (or numbers) of the same shape; the row's dtype is
                ``got``'s.
            tol: the test's tolerance.

        Returns:
            the measured difference.
        """
        diff = max_difference(got, expected)
        self.record(comparison, reference, _dtype_name(got), diff, tol)
        return diff

    def record(self, comparison: str, reference: str, dtype: str, diff: float,
               tol: float) -> None:
        """Record a difference measured by the test itself (:meth:`check` measures it)."""
        if comparison in self._comparisons:
            raise AssertionError(f"{comparison!r} is recorded twice by {self.nodeid}")
        self._comparisons.add(comparison)
        state = _get_state()
        state.recorded[self.nodeid] = state.recorded.get(self.nodeid, 0) + 1
        assert diff <= tol, (f"{comparison} vs {reference}: max |difference| {diff:.3g} > "
                             f"tolerance {tol:.3g}")
        row = {"test": self.nodeid, "comparison": comparison, "reference": reference,
               "dtype": dtype, "max_difference": diff, "tolerance": tol}
        if WRITE:
            state.rows.append(row)
            return
        committed = state.committed.get((self.nodeid, comparison))
        if committed is None:
            pytest.fail(f"{self.nodeid}: {comparison!r} has no row in {LEDGER_FILE.name}; "
                        f"after a deliberate change run `make ledger` and commit the file")
        limit = allowed(committed["max_difference"], dtype)
        if diff > limit:
            pytest.fail(f"{comparison} vs {reference}: max |difference| {diff:.3g} exceeds the "
                        f"committed {committed['max_difference']:.3g} (allowed up to "
                        f"{limit:.3g}): a regression, or refresh after a deliberate change "
                        f"with `make ledger`")

    def planted_bugs(self, mutants: list[dict]) -> None:
        """Record the planted-bug score: one entry per mutant ``{"name", "killed_by",
        "killed"}``. Outside a refresh, the committed counts must be this run's."""
        state = _get_state()
        state.recorded[self.nodeid] = state.recorded.get(self.nodeid, 0) + 1
        score = {"test": self.nodeid, "planted": len(mutants),
                 "killed": sum(m["killed"] for m in mutants), "mutants": mutants}
        if WRITE:
            state.score = score
            return
        committed = state.committed_score
        if committed is None or (committed["planted"], committed["killed"]) != (
                score["planted"], score["killed"]):
            pytest.fail(f"the planted-bug score is {score['killed']}/{score['planted']} but "
                        f"{LEDGER_FILE.name} says "
                        f"{None if committed is None else (committed['killed'], committed['planted'])}"
                        f": run `make ledger` and commit the file")


# ---- guards: a comparison with a reference is a marked test --------------------------------

# PyTorch's references, as (owner, attribute): a direct call from the body of a test that is
# not marked `equality` fails that test.
REFERENCES = (
    (torch.nn.functional, "scaled_dot_product_attention"),
    (torch.nn.MultiheadAttention, "forward"),
    (torch.nn.Transformer, "forward"),
    (torch.nn.LayerNorm, "forward"),
    (torch.nn.RMSNorm, "forward"),
)


TORCH_DIR = Path(torch.__file__).resolve().parent


def _called_from_a_test_body() -> bool:
    """Whether the caller of the spied reference, past PyTorch's own frames (a module's
    ``__call__``), is the body of a test function."""
    frame = sys._getframe(2)
    while frame is not None and Path(frame.f_code.co_filename).resolve().is_relative_to(TORCH_DIR):
        frame = frame.f_back
    return (frame is not None and frame.f_code.co_name.startswith("test_")
            and _is_test_file(frame.f_code.co_filename))


def _is_test_file(path) -> bool:
    path = Path(str(path))
    return path.name.startswith("test_") and path.suffix == ".py"


class _Guard:
    """While an unmarked test runs: notes the references it calls itself."""

    def __init__(self):
        self.seen: list[str] = []

    def spy(self, owner, name):
        original = getattr(owner, name)
        guard = self
        label = f"{getattr(owner, '__name__', owner)}.{name}"

        def spied(*args, **kwargs):
            if _called_from_a_test_body():
                guard.seen.append(label)
            return original(*args, **kwargs)

        spied.__wrapped__ = original  # what it stands for, to whoever looks (a checker's guard)
        return spied


_guard: _Guard | None = None


def reference_loaded(package: str) -> None:
    """Called by ``conftest.require``: loading a reference library is a comparison."""
    if _guard is not None:
        _guard.seen.append(f"require({package!r})")


# ---- the hooks ----------------------------------------------------------------------------

def pytest_configure(config):
    # Registered here, not in pyproject.toml: they say what a test proves, not what it costs,
    # so `make check` runs them (its -m expression leaves out the markers of pyproject.toml).
    config.addinivalue_line("markers", "equality: compares the library with an independent "
                            "implementation; records its rows through the `ledger` fixture")
    config.addinivalue_line("markers", "differs: calls a reference only to show a difference "
                            "(a control), not an equality: no ledger row")
    config.addinivalue_line("markers", "reference_input: builds its input with a reference "
                            "library (a Hugging Face config) and compares nothing: no ledger row")
    if WRITE and hasattr(config, "workerinput"):
        raise pytest.UsageError("LEDGER_WRITE=1 writes one file: run without -n (make ledger)")


@pytest.fixture
def ledger(request) -> Ledger:
    """Record this test's comparisons in the equality ledger (tests/ledger_plugin.py)."""
    return Ledger(request.node.nodeid)


def pytest_runtest_setup(item):
    marked = item.get_closest_marker("equality") is not None
    asks = "ledger" in getattr(item, "fixturenames", ())
    if marked and not asks:
        pytest.fail(f"{item.nodeid} is marked equality but does not use the ledger fixture")
    if asks and not marked:
        pytest.fail(f"{item.nodeid} uses the ledger fixture: mark it @pytest.mark.equality")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    global _guard
    watch = (all(item.get_closest_marker(m) is None
                 for m in ("equality", "differs", "reference_input", "gpu"))
             and _is_test_file(item.fspath))
    if not watch:
        return (yield)
    _guard = _Guard()
    mp = pytest.MonkeyPatch()
    try:
        for owner, name in REFERENCES:
            mp.setattr(owner, name, _guard.spy(owner, name))
        result = yield  # raises what the test raised
    finally:
        mp.undo()
        seen, _guard = _guard.seen, None
    if seen:
        pytest.fail(f"{item.nodeid} compares with a reference ({', '.join(sorted(set(seen)))}) "
                    f"but is not marked equality: mark it and record the comparison through "
                    f"the ledger fixture")
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    marked = item.get_closest_marker("equality") is not None
    if WRITE and report.skipped and marked:
        report.outcome = "failed"  # a refresh needs every reference: a skipped row would vanish
        report.longrepr = f"{item.nodeid} was skipped: `make ledger` needs every reference"
    if (call.when == "call" and report.passed and marked
            and not _get_state().recorded.get(item.nodeid)):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} is marked equality but recorded no row "
                           f"(ledger.check)")
    return report


def pytest_sessionfinish(session, exitstatus):
    if not WRITE or exitstatus != 0 or _state is None:
        return
    state = _state
    rows = sorted(state.rows, key=lambda r: (r["test"], r["comparison"]))
    if not rows:
        return
    data = {
        "about": "Written by `make ledger` (tests/ledger_plugin.py); rendered by "
                 "appendix/ledger.ipynb. Do not edit by hand.",
        "torch": torch.__version__.split("+")[0],
        "rows": rows,
        PLANTED: state.score,
    }
    LEDGER_FILE.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n",
                           encoding="utf-8")
