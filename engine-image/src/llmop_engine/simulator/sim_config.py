"""Simulator command line: the vLLM flags it models plus `--sim-*` flags.

The renderer emits the same flags for both backends, so any other vLLM flag is accepted and ignored
with a log line rather than rejected. Defaults model a 7-8B model in bf16 on one 80 GB GPU:
~20 ms per decode step at batch 1 growing ~0.15 ms per running sequence, 10k prompt tokens/s of
prefill, 16k KV blocks of 16 tokens. The operator renders one more flag for the simulator: the KV
cache its capacity plan computed for the CR's GPU, as `--num-gpu-blocks-override` (blocks of
`--block-size`), which the simulator then reports and admits requests against.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmop_engine.contract import DEFAULT_BLOCK_SIZE, MASTER_ADDR, MASTER_PORT, EngineFlag
from llmop_engine.simulator import request_faults
from llmop_engine.simulator.group import GroupConfig

log = logging.getLogger("llmop_engine.simulator")

FAULTS = ("none", "hang", "crash", "slow", "refuse", "error")
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""vLLM 0.32's allowed `--max-lora-rank` values (`MaxLoRARanks`)."""
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"  # what `vllm serve` serves without a model argument


@dataclass(frozen=True)
class SimConfig:
    model: str = DEFAULT_MODEL
    served_model_names: tuple[str, ...] = ()
    host: str = "0.0.0.0"
    port: int = 8000
    max_num_seqs: int = 256
    max_model_len: int = 8192
    max_num_batched_tokens: int = 8192
    block_size: int = DEFAULT_BLOCK_SIZE
    num_gpu_blocks: int = 16384
    gpu_memory_utilization: float = 0.92
    enable_prefix_caching: bool = True
    shutdown_timeout: float = 0.0
    api_key: str | None = None
    disable_log_stats: bool = False
    enable_lora: bool = False
    max_loras: int = 1
    max_cpu_loras: int = 1
    max_lora_rank: int = 16
    load_seconds: float = 5.0
    decode_ms: float = 20.0
    decode_ms_per_seq: float = 0.15
    prefill_tokens_per_s: float = 10000.0
    default_max_tokens: int = 256
    fault: str = "none"
    fault_after_seconds: float = 0.0
    slow_factor: float = 10.0
    request_fault: str = ""
    """Default `X-Sim-Fault` spec for requests without the header (`request_faults`)."""
    eos_probability: float = 0.0
    """Chance per token that an answer ends (EOS) unless `ignore_eos`: `decoding.plan`."""
    stream_interval: int = 1
    """vLLM's `--stream-interval`: a stream's chunk carries this many tokens (the first token
    and the finish go at once), as vLLM's output processor batches them (`streaming`)."""
    crash_exit_delay_seconds: float = 1.0
    # vLLM's API server exits 0 after its EngineCore died: the simulator does the same.
    crash_exit_code: int = 0
    group: GroupConfig = field(default_factory=GroupConfig)

    @property
    def served_model_name(self) -> str:
        return self.served_model_names[0] if self.served_model_names else self.model


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmop-engine simulate",
        description="vLLM-compatible simulator. Runtime faults: POST /sim/fault "
        '{"mode": "hang|crash|slow|refuse|error|none"}; counters: GET /sim/stats.',
    )
    p.add_argument("--model", default=None)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument(EngineFlag.BLOCK_SIZE, type=int, default=DEFAULT_BLOCK_SIZE)
    # The KV cache's blocks, as vLLM's flag fixes them. The operator renders it for the simulator
    # from its capacity plan: the simulated engine holds what its GPU would (a count only: no
    # memory is allocated per block).
    p.add_argument(EngineFlag.NUM_GPU_BLOCKS_OVERRIDE, type=int, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    # vLLM's V1 engine caches prefixes unless told not to; the renderer may pass either form.
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--shutdown-timeout", type=float, default=0.0)
    p.add_argument("--api-key", default=None)
    p.add_argument("--disable-log-stats", action="store_true")
    p.add_argument("--stream-interval", type=int, default=1)
    # vLLM 0.32's LoRA flags and defaults (vllm/config/lora.py); --max-cpu-loras defaults to
    # --max-loras and may not be below it.
    p.add_argument("--enable-lora", action="store_true")
    p.add_argument("--max-loras", type=int, default=1)
    p.add_argument("--max-cpu-loras", type=int, default=None)
    p.add_argument("--max-lora-rank", type=int, default=16, choices=MAX_LORA_RANKS)
    # vLLM's native multi-node mode (`simulator.group`): rank 0 serves, the others are headless.
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--master-addr", default=MASTER_ADDR)
    p.add_argument("--master-port", type=int, default=MASTER_PORT)
    sim = p.add_argument_group("simulation")
    sim.add_argument(
        "--sim-load-seconds",
        type=float,
        default=5.0,
        help="time before the port listens (weights loading)",
    )
    sim.add_argument(
        "--sim-kv-blocks",
        type=int,
        default=None,
        help="KV cache blocks, over --num-gpu-blocks-override [16384]",
    )
    sim.add_argument("--sim-decode-ms", type=float, default=20.0, help="decode step at batch 1")
    sim.add_argument(
        "--sim-decode-ms-per-seq",
        type=float,
        default=0.15,
        help="extra step time per running sequence",
    )
    sim.add_argument("--sim-prefill-tokens-per-s", type=float, default=10000.0)
    sim.add_argument(
        "--sim-default-max-tokens",
        type=int,
        default=256,
        help="chat max_tokens when the request sets none",
    )
    sim.add_argument("--sim-fault", choices=FAULTS, default="none")
    sim.add_argument(
        "--sim-fault-after",
        type=float,
        default=0.0,
        help="seconds after listening before --sim-fault applies",
    )
    sim.add_argument("--sim-slow-factor", type=float, default=10.0)
    sim.add_argument(
        "--sim-eos-probability",
        type=float,
        default=0.0,
        help="chance per token that an answer ends early (EOS, finish 'stop') unless the request "
        "sets ignore_eos; decided by the context, so repeatable [0: always to max_tokens]",
    )
    sim.add_argument(
        "--sim-request-fault",
        default="",
        help="fault every request without an X-Sim-Fault header: KIND@N or KIND@ctx:N, "
        "comma-separated, KIND crash|hang|cut|error",
    )
    sim.add_argument("--sim-crash-exit-delay", type=float, default=1.0)
    sim.add_argument(
        "--sim-crash-exit-code",
        type=int,
        default=0,
        help="exit code after a crash [0, what vLLM returns after its EngineCore died]",
    )
    return p


def parse(argv: Sequence[str]) -> SimConfig:
    """Parse `[<model>] [flags…]`; unknown vLLM flags are logged and ignored."""
    args = list(argv)
    model: str | None = None
    if args and not args[0].startswith("-"):
        model = args.pop(0)
    parser = build_parser()
    ns, unknown = parser.parse_known_args(args)
    max_cpu_loras = ns.max_loras if ns.max_cpu_loras is None else ns.max_cpu_loras
    if max_cpu_loras < ns.max_loras:
        parser.error(f"max_cpu_loras ({max_cpu_loras}) must be >= max_loras ({ns.max_loras})")
    if unknown:
        log.info("simulator ignores vLLM flags it does not model: %s", " ".join(unknown))
    if not 0 <= ns.node_rank < max(1, ns.nnodes):
        parser.error(f"--node-rank {ns.node_rank} is outside 0..{max(1, ns.nnodes) - 1}")
    if ns.stream_interval < 1:
        parser.error(f"--stream-interval {ns.stream_interval}: must be at least 1 (as vLLM's)")
    if ns.headless and ns.node_rank == 0:
        parser.error("--headless is for ranks other than 0 (rank 0 serves the API)")
    model = ns.model or model or DEFAULT_MODEL
    blocks = ns.sim_kv_blocks or ns.num_gpu_blocks_override or 16384
    return SimConfig(
        model=model,
        served_model_names=tuple(ns.served_model_name or ()),
        host=ns.host,
        port=ns.port,
        max_num_seqs=max(1, ns.max_num_seqs),
        max_model_len=max(16, ns.max_model_len),
        max_num_batched_tokens=max(1, ns.max_num_batched_tokens),
        block_size=max(1, ns.block_size),
        num_gpu_blocks=max(1, blocks),
        gpu_memory_utilization=ns.gpu_memory_utilization,
        enable_prefix_caching=ns.enable_prefix_caching,
        shutdown_timeout=max(0.0, ns.shutdown_timeout),
        api_key=ns.api_key,
        disable_log_stats=ns.disable_log_stats,
        enable_lora=ns.enable_lora,
        max_loras=max(1, ns.max_loras),
        max_cpu_loras=max_cpu_loras,
        max_lora_rank=ns.max_lora_rank,
        load_seconds=max(0.0, ns.sim_load_seconds),
        decode_ms=max(0.1, ns.sim_decode_ms),
        decode_ms_per_seq=max(0.0, ns.sim_decode_ms_per_seq),
        prefill_tokens_per_s=max(1.0, ns.sim_prefill_tokens_per_s),
        default_max_tokens=max(1, ns.sim_default_max_tokens),
        fault=ns.sim_fault,
        fault_after_seconds=max(0.0, ns.sim_fault_after),
        slow_factor=max(1.0, ns.sim_slow_factor),
        request_fault=_request_fault(parser, ns.sim_request_fault),
        eos_probability=min(1.0, max(0.0, ns.sim_eos_probability)),
        stream_interval=ns.stream_interval,
        crash_exit_delay_seconds=max(0.0, ns.sim_crash_exit_delay),
        crash_exit_code=ns.sim_crash_exit_code,
        group=GroupConfig(
            nnodes=max(1, ns.nnodes),
            node_rank=ns.node_rank,
            headless=ns.headless,
            master_addr=ns.master_addr,
            master_port=ns.master_port,
        ),
    )


def _request_fault(parser: argparse.ArgumentParser, spec: str) -> str:
    try:
        request_faults.parse(spec)
    except request_faults.RequestFaultError as exc:
        parser.error(str(exc))
    return spec.strip()
