"""Every library file stays short enough to read top to bottom: at most 450 lines."""
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parent.parent / "transformer_lib"
MAX_LINES = 450
FILES = sorted(LIB.rglob("*.py"))


def _too_long(path: Path, limit: int = MAX_LINES) -> str | None:
    """A message naming ``path`` and its line count if it has more than ``limit`` lines."""
    lines = len(path.read_text(encoding="utf-8").splitlines())
    name = path.relative_to(LIB.parent) if path.is_relative_to(LIB.parent) else path
    if lines > limit:
        return f"{name} has {lines} lines, more than {limit}: split it by subject"
    return None


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(LIB)) for p in FILES])
def test_library_file_has_at_most_450_lines(path):
    message = _too_long(path)
    assert message is None, message


def test_the_library_has_files_to_measure():
    names = {str(p.relative_to(LIB)) for p in FILES}
    assert {"attention.py", "plotting/curves.py", "widgets/frames.py"} <= names


def test_a_long_file_is_reported_by_name(tmp_path):
    long_file = tmp_path / "long_module.py"
    long_file.write_text("x = 1\n" * 451, encoding="utf-8")
    assert _too_long(long_file) == (f"{long_file} has 451 lines, more than 450: "
                                    "split it by subject")
    long_file.write_text("x = 1\n" * 450, encoding="utf-8")
    assert _too_long(long_file) is None
