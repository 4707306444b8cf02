"""llmop: a Kubernetes operator that serves LLMs on GPUs."""

__version__ = "0.1.0"
