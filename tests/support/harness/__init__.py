"""Local harness for the engine tests and the benchmark.

Replicas run as real processes; the load generator routes like a Kubernetes Service (only to
endpoints whose readiness a periodic poll saw as 200).
"""
