"""llmop-router: one OpenAI endpoint for every routed LLMDeployment, routing by prefix and load.

Pure core: `contract` (what the router and the operator share), `prefix` (the routing key of a
request body), `ring` (consistent hashing with bounded load over the ready engine pods),
`routes` (the table), `discovery` (CRs and EndpointSlices into it), `hold` (the queues of
scale to zero); I/O: `proxy` (send and relay), `scale_to_zero` (hold, wake, release), `app`
(the HTTP server), `kube` (list, watch, wake).
"""

__version__ = "0.1.0"
