"""`python -m llmop_engine …` is `llmop-engine …` (the agent launches the simulator this way)."""

import sys

from llmop_engine.cli import main

sys.exit(main())
