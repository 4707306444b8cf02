"""Python source parsed for the architecture and layer tests.

CPython 3.11's `ast` keeps one recursion counter per interpreter, not per thread, so a parse
that runs while another thread builds an AST (the `traceback` module parses source to place its
carets, so any thread logging an exception does) can fail with "SystemError: AST constructor
recursion depth mismatch" (python/cpython#106905). The file is fine; parsing it again succeeds.
"""

from __future__ import annotations

import ast
from pathlib import Path

ATTEMPTS = 5


def parse_file(path: Path) -> ast.Module:
    source = path.read_text(encoding="utf-8")
    for attempt in range(ATTEMPTS):
        try:
            return ast.parse(source, filename=str(path))
        except SystemError:
            if attempt == ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")
