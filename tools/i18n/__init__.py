"""The book's editions in other languages, for any list of languages.

The languages are one list in ``_config.yml`` (``sphinx: config: book_languages``), the
source first; ``languages`` reads it. The rest is the same for every language:

- ``editions``: the config of each edition's build (and of message extraction).
- ``messages``: the gettext catalogs ``locales/<code>``, extracted and checked.
- ``notebooks``: each edition's notebooks for Colab, Binder and download (``<folder>/``).
- ``fonts``: the subset fonts of a language's script, where its entry asks for one.

Run from the repository's root: ``python tools/i18n {config,messages,notebooks,fonts} ...``.
The Sphinx side (language switch, search, explorers' words) is in ``_ext/i18n_*.py``.
"""
