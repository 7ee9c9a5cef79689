"""The library's files stay short enough to read top to bottom: at most 450 lines. The rule is
guidance (CONTRIBUTING, "Layout"): a file that reads better whole than split may pass it when
named below, with the reason."""
from pathlib import Path

LIB = Path(__file__).resolve().parent.parent / "transformer_lib"
MAX_LINES = 450
# file -> why it is one file: the exceptions, each chosen, not grown into
LONGER = {
    # Their docstrings are the API reference (Args and Returns with shapes for every name).
    "attention.py": "the three attention entries, the layer and their documented arguments",
    "text.py": "the text model's data, training loop and documented bundled results",
    # One float64 reference decoder, read top to bottom, and the three checkers built on it.
    "checks/ch06_decoder_pieces.py": "the reference decoder and its SwiGLU, block and logits "
                                     "checkers, each building on the one before",
}


def _too_long(files: list[Path], limit: int = MAX_LINES,
              allowed: frozenset[str] = frozenset()) -> list[str]:
    """A message for each of ``files`` with more than ``limit`` lines, naming it and its
    count, except the ``allowed`` ones (paths relative to the library)."""
    messages = []
    for path in files:
        lines = len(path.read_text(encoding="utf-8").splitlines())
        name = path.relative_to(LIB).as_posix() if path.is_relative_to(LIB) else str(path)
        if lines > limit and name not in allowed:
            messages.append(f"{name} has {lines} lines, more than {limit}: split it by "
                            "subject, or name it in LONGER with the reason")
    return messages


def test_library_files_have_at_most_450_lines_or_a_named_reason(tmp_path):
    files = sorted(LIB.rglob("*.py"))
    assert {"attention.py", "plotting/curves.py", "widgets/frames.py"} <= {
        p.relative_to(LIB).as_posix() for p in files}
    assert _too_long(files, allowed=frozenset(LONGER)) == []
    assert all((LIB / name).exists() for name in LONGER), "an exception names no file"
    # the check itself: 451 lines is reported by name, 450 is not
    long_file, short_file = tmp_path / "long_module.py", tmp_path / "short_module.py"
    long_file.write_text("x = 1\n" * 451, encoding="utf-8")
    short_file.write_text("x = 1\n" * 450, encoding="utf-8")
    assert _too_long([long_file, short_file]) == [
        f"{long_file} has 451 lines, more than 450: split it by subject, or name it in "
        "LONGER with the reason"]
