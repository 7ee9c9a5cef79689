"""transformer_lib: the from-scratch Transformer library of the course "Transformers from scratch".

The modules are imported by name (``from transformer_lib.attention import MultiHeadAttention``);
the book's API reference (``appendix/api.md``) documents every one. ``__version__`` is the release
a student copy installs (its tag ``v<version>``); it equals ``[project].version`` in
pyproject.toml, which a test checks.
"""

__version__ = "0.5.0"
