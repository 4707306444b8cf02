"""llmop-router: one OpenAI endpoint for every routed LLMDeployment, routing by prefix and load.

Pure core: `prefix` (the routing key of a request body), `ring` (consistent hashing with bounded
load over the ready engine pods); I/O: `server` (the streaming proxy).
"""

__version__ = "0.1.0"
