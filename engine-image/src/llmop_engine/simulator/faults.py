"""Fault injection for the simulator: the failure modes the agent must tell apart.

- `hang`: the scheduler stops stepping (a wedged GPU). `/health` stays 200 and `/metrics` keeps
  answering with frozen counters, exactly what real vLLM shows when a forward pass never returns.
- `crash`: the engine dies: `/health` answers 503, open requests end with an error, and the process
  exits shortly after with a non-zero code (vLLM's watchdog does the same within ~5 s).
- `slow`: every decode step takes `slowFactor` times longer; tokens still flow.
- `refuse`: generation endpoints answer 503 (overloaded or misconfigured); `/health` is 200.
- `error`: requests are admitted and prefilled, then finish with vLLM's `FinishReason.ERROR`
  (`finished_reason="error"` in `vllm:request_success_total`, what a per-request engine failure
  gives); `/health` stays 200. The error-rate alert's fault.
- `none`: normal operation.

Switch at start with `--sim-fault MODE [--sim-fault-after S]`, or at run time with
`POST /sim/fault {"mode": "hang"}` (optional `"slowFactor": 20`) on the API port.

Faults of single requests at a chosen token (crash, hang, cut, error: `request_faults`) come with
the request's `X-Sim-Fault` header, or from a default held here: `--sim-request-fault SPEC` or
`POST /sim/fault {"requestFault": "cut@5"}` (`mode` may then be left out; "" clears it).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmop_engine.simulator import request_faults
from llmop_engine.simulator.sim_config import FAULTS


class FaultError(ValueError):
    """An unknown fault mode or parameter."""


@dataclass
class FaultState:
    mode: str = "none"
    slow_factor: float = 10.0
    since: float = 0.0
    request_fault: str = ""
    """The request fault spec for requests without an `X-Sim-Fault` header."""

    def set(self, mode: str, now: float, slow_factor: float | None = None) -> None:
        if mode not in FAULTS:
            raise FaultError(f"unknown fault mode {mode!r}; one of {', '.join(FAULTS)}")
        if slow_factor is not None:
            if slow_factor < 1.0:
                raise FaultError("slowFactor must be >= 1")
            self.slow_factor = slow_factor
        self.mode = mode
        self.since = now

    def set_request_fault(self, spec: str) -> None:
        try:
            request_faults.parse(spec)
        except request_faults.RequestFaultError as exc:
            raise FaultError(str(exc)) from exc
        self.request_fault = spec.strip()

    @property
    def step_factor(self) -> float:
        return self.slow_factor if self.mode == "slow" else 1.0

    def as_json(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "slowFactor": self.slow_factor,
            "requestFault": self.request_fault,
        }
