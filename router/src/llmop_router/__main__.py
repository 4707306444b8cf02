"""`python -m llmop_router`."""

from llmop_router.cli import main

main()
