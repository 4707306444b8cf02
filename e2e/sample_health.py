"""`make dev`'s verdict on a sample LLMDeployment: Ready with nothing wrong reported.

Ready alone is not enough for a sample a new user looks at first: a CR can be Ready and still
say that requests to its endpoint fail (`Degraded` RouterUnavailable) or that its engines hold
far fewer KV cache tokens than planned (`CapacityPlanned` CapacityShortfall). This waits until
the CR is Ready for its current generation, its engines' real capacity has been read back (with
`--engines-report`: only where its pods really run), and no condition reports a problem; it
prints what is still wrong when the time is up.

Usage: sample_health.py --kubeconfig FILE [--kubectl PATH] [--timeout S] [--engines-report]
NAMESPACE NAME. Exit 0 when healthy, 1 with the problems on stderr when not within the timeout.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from typing import Any

# Conditions whose True is a problem (abnormal-true), and reasons that are a problem whatever
# their condition's status says.
ABNORMAL_TRUE = ("Degraded", "Stalled")
PROBLEM_REASONS = ("CapacityShortfall", "RouterUnavailable")


def problems(cr: dict[str, Any], *, engines_report: bool) -> list[str]:
    """What keeps this LLMDeployment from being a healthy sample; empty when nothing does."""
    found: list[str] = []
    generation = cr.get("metadata", {}).get("generation")
    status = cr.get("status") or {}
    if status.get("observedGeneration") != generation:
        found.append(
            f"status is for generation {status.get('observedGeneration')}, not {generation}"
        )
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = conditions.get("Ready")
    if ready is None or ready.get("status") != "True":
        what = "missing" if ready is None else f"{ready.get('status')} {ready.get('reason')}"
        found.append(f"Ready is {what}")
    for kind, condition in sorted(conditions.items()):
        status_, reason = condition.get("status"), condition.get("reason")
        if (kind in ABNORMAL_TRUE and status_ == "True") or reason in PROBLEM_REASONS:
            found.append(f"{kind}={status_} {reason}: {condition.get('message', '')}")
    if engines_report:
        actual = ((status.get("plan") or {}).get("actual") or {}).get("kvCacheTokens")
        if actual is None:
            found.append("the engines' KV cache capacity has not been read back yet")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--kubectl", default=shutil.which("kubectl") or "kubectl")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--engines-report", action="store_true")
    parser.add_argument("namespace")
    parser.add_argument("name")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout
    found = ["not read yet"]
    while True:
        result = subprocess.run(
            [args.kubectl, "--kubeconfig", args.kubeconfig, "get", "llmdeployment",
             "-n", args.namespace, args.name, "-o", "json"],
            capture_output=True, text=True, check=False, timeout=30,
        )  # fmt: skip
        if result.returncode == 0:
            found = problems(json.loads(result.stdout), engines_report=args.engines_report)
            if not found:
                return 0
        else:
            found = [result.stderr.strip() or f"kubectl exited {result.returncode}"]
        if time.monotonic() >= deadline:
            for problem in found:
                print(f"{args.namespace}/{args.name}: {problem}", file=sys.stderr)
            return 1
        time.sleep(1.0)


if __name__ == "__main__":
    sys.exit(main())
