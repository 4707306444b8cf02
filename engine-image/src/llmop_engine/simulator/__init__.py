"""A vLLM stand-in for CPU-only clusters and tests: real HTTP, continuous batching, vLLM metrics."""
