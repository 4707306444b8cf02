"""The file I/O half of `make generate`: `llmop.crdgen` renders the generated files from values;
this module reads the current docs/engine-contract.md and writes every file it renders.

    python -m llmop.crdgen_io [--root REPOSITORY]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from llmop import crdgen


def write_generated_files(root: Path) -> list[Path]:
    """Write every generated file under `root` (the repository); return what was written."""
    engine_contract = (root / crdgen.ENGINE_CONTRACT_PATH).read_text(encoding="utf-8")
    written = []
    for relative, content in crdgen.generated_files(engine_contract).items():
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> None:
    """Entry point of `make generate`."""
    parser = argparse.ArgumentParser(description="Write the files llmop.crdgen generates.")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root")
    args = parser.parse_args(argv)
    for path in write_generated_files(args.root):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
