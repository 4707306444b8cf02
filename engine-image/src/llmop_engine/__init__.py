"""llmop engine agent: supervises vLLM or the simulator, serves probes, drains without loss."""

__version__ = "0.1.0"
