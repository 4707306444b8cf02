"""Pure parser of vLLM's Prometheus text into the few numbers the agent judges health by.

vLLM renames metrics between releases (`gpu_cache_usage_perc` → `kv_cache_usage_perc`, counters with
or without `_total`), and with data parallelism every series carries an `engine` label. This module
hides both: each quantity is read from the first name present in a fallback list and summed (or
averaged) across engines, so the agent's `llmop_engine_*` metrics stay stable.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

# Fallback chains, newest name first.
WAITING = ("vllm:num_requests_waiting",)
RUNNING = ("vllm:num_requests_running",)
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
GENERATION_TOKENS = ("vllm:generation_tokens_total", "vllm:generation_tokens")
PROMPT_TOKENS = ("vllm:prompt_tokens_total", "vllm:prompt_tokens")
CACHE_CONFIG = ("vllm:cache_config_info", "vllm:cache_config")

_WANTED = frozenset(WAITING + RUNNING + KV_USAGE + GENERATION_TOKENS + PROMPT_TOKENS + CACHE_CONFIG)


@dataclass(frozen=True)
class EngineMetrics:
    """One scrape, reduced. `None` means the engine does not expose that quantity."""

    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    kv_capacity_tokens: int | None = None
    generation_tokens: float | None = None
    prompt_tokens: float | None = None

    @property
    def pending(self) -> float | None:
        """Requests the engine holds (waiting + running), or None when neither is exposed."""
        if self.waiting is None and self.running is None:
            return None
        return (self.waiting or 0.0) + (self.running or 0.0)

    @property
    def progress_tokens(self) -> float | None:
        """A counter that grows whenever the engine does work: generated plus prefilled tokens."""
        if self.generation_tokens is None and self.prompt_tokens is None:
            return None
        return (self.generation_tokens or 0.0) + (self.prompt_tokens or 0.0)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def _parse_labels(text: str) -> dict[str, str]:
    """Parse `a="x",b="y"` honouring backslash escapes inside quoted values."""
    labels: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " ,":
            i += 1
        eq = text.find("=", i)
        if eq < 0:
            break
        key = text[i:eq].strip()
        i = eq + 1
        if i >= n or text[i] != '"':
            break
        i += 1
        value: list[str] = []
        while i < n and text[i] != '"':
            if text[i] == "\\" and i + 1 < n:
                nxt = text[i + 1]
                value.append("\n" if nxt == "n" else nxt)
                i += 2
                continue
            value.append(text[i])
            i += 1
        labels[key] = "".join(value)
        i += 1
    return labels


def iter_samples(text: str, wanted: frozenset[str] = _WANTED) -> Iterator[Sample]:
    """Samples whose metric name is in `wanted`; other lines are skipped without parsing labels."""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name = line[:brace]
            if name not in wanted:
                continue
            close = line.rfind("}")
            if close < brace:
                continue
            labels = _parse_labels(line[brace + 1 : close])
            rest = line[close + 1 :].split()
        else:
            parts = line.split()
            name = parts[0]
            if name not in wanted:
                continue
            labels = {}
            rest = parts[1:]
        if not rest:
            continue
        try:
            value = float(rest[0])
        except ValueError:
            continue
        yield Sample(name, labels, value)


def _first_present(by_name: dict[str, list[Sample]], names: tuple[str, ...]) -> list[Sample]:
    for name in names:
        if by_name.get(name):
            return by_name[name]
    return []


def _sum(samples: list[Sample]) -> float | None:
    values = [s.value for s in samples if not math.isnan(s.value)]
    return sum(values) if values else None


def _mean(samples: list[Sample]) -> float | None:
    values = [s.value for s in samples if not math.isnan(s.value)]
    return sum(values) / len(values) if values else None


def _int_label(labels: dict[str, str], key: str) -> int | None:
    raw = labels.get(key)
    if raw is None or raw in ("", "None"):
        return None
    try:
        return int(float(raw))
    except ValueError:
        return None


def _kv_capacity(samples: list[Sample]) -> int | None:
    """Capacity in tokens from the cache-config info series.

    Prefer the per-engine `kv_cache_size_tokens` (summed over DP engines); otherwise
    `num_gpu_blocks * block_size`, where vLLM already sums `num_gpu_blocks` across engines, so the
    largest series is taken rather than adding them up again.
    """
    per_engine: dict[str, int] = {}
    for s in samples:
        tokens = _int_label(s.labels, "kv_cache_size_tokens")
        if tokens is not None and tokens > 0:
            per_engine[s.labels.get("engine", "0")] = tokens
    if per_engine:
        return sum(per_engine.values())
    best: int | None = None
    for s in samples:
        blocks = _int_label(s.labels, "num_gpu_blocks")
        block_size = _int_label(s.labels, "block_size")
        if blocks is not None and block_size is not None and blocks > 0 and block_size > 0:
            best = max(best or 0, blocks * block_size)
    return best


def parse(text: str) -> EngineMetrics:
    """Reduce a vLLM `/metrics` body to `EngineMetrics`."""
    by_name: dict[str, list[Sample]] = {}
    for sample in iter_samples(text):
        by_name.setdefault(sample.name, []).append(sample)
    return EngineMetrics(
        waiting=_sum(_first_present(by_name, WAITING)),
        running=_sum(_first_present(by_name, RUNNING)),
        kv_usage=_mean(_first_present(by_name, KV_USAGE)),
        kv_capacity_tokens=_kv_capacity(_first_present(by_name, CACHE_CONFIG)),
        generation_tokens=_sum(_first_present(by_name, GENERATION_TOKENS)),
        prompt_tokens=_sum(_first_present(by_name, PROMPT_TOKENS)),
    )
