"""The agent's HTTP client to the engine on localhost: `/health`, `/metrics`, `/v1/models`, the
one-token deep probe, and vLLM's runtime LoRA API (`/v1/load_lora_adapter`,
`/v1/unload_lora_adapter`). Every call has its own timeout and never raises; results are plain
values.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass

import aiohttp

from llmop_engine import __version__, contract
from llmop_engine.health import ProbeResult, Reach
from llmop_engine.vllm_metrics import EngineMetrics, parse

PROBE_USER_AGENT = f"llmop-engine-probe/{__version__}"
# vLLM's EngineDeadError text, in the HTTP 500 it answers once its EngineCore died (0.32).
ENGINE_DEAD_MESSAGE = b"EngineCore encountered an issue"
# Below vLLM's server-side keep-alive (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, default 5 s).
KEEPALIVE_SECONDS = 2.0


@dataclass(frozen=True)
class LoraAnswer:
    """vLLM's answer to a LoRA load or unload."""

    status: int | None
    """The HTTP status; None when nothing answered (refused, reset, timed out)."""
    message: str
    """The success text, vLLM's error message, or what went wrong on the way."""

    @property
    def ok(self) -> bool:
        return self.status == 200


def error_message(body: bytes) -> str:
    """vLLM's `{"error": {"message": …}}` (or FastAPI's `{"detail": …}`), else the text itself."""
    text = body.decode(errors="replace").strip()
    with contextlib.suppress(ValueError):
        doc = json.loads(text)
        if isinstance(doc, dict):
            error = doc.get("error")
            if isinstance(error, dict) and isinstance(error.get("message"), str):
                return str(error["message"])
            if isinstance(error, str):
                return error
            if isinstance(doc.get("detail"), str):
                return str(doc["detail"])
    return text[:500]


class EngineClient:
    def __init__(self, port: int, api_key: str | None = None, host: str = "127.0.0.1") -> None:
        self.base = f"http://{host}:{port}"
        self.api_key = api_key
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # One keep-alive connection pool for polls; the deep probe shares it. Idle
            # connections are dropped before vLLM's uvicorn closes them (5 s): reusing one just
            # as the server closes it fails the request with ServerDisconnectedError, which a
            # probe would report as a failure of the engine.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=4, force_close=False, keepalive_timeout=KEEPALIVE_SECONDS
                ),
                headers={"User-Agent": PROBE_USER_AGENT},
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def health(self, timeout: float) -> Reach:
        try:
            async with self._http().get(
                self.base + "/health", timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                await resp.read()
                if resp.status == 200:
                    return Reach.OK
                return Reach.DEAD if resp.status == 503 else Reach.ERROR
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, ConnectionRefusedError):
                return Reach.REFUSED
            return Reach.ERROR
        except (aiohttp.ClientError, TimeoutError, OSError):
            return Reach.ERROR

    async def metrics(self, timeout: float) -> EngineMetrics | None:
        return (await self.read_metrics(timeout))[1]

    async def read_metrics(self, timeout: float) -> tuple[bool, EngineMetrics | None]:
        """(answered, figures). Answered without figures: e.g. --disable-log-stats, no vllm:*
        metrics at all. Not answered: a timeout or error, which a saturated vLLM API server
        (one event loop streaming for every client) produces while /health still answers."""
        try:
            async with self._http().get(
                self.base + "/metrics", timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                if resp.status != 200:
                    return False, None
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError, OSError, UnicodeDecodeError):
            return False, None
        parsed = parse(text)
        if parsed.pending is None and parsed.progress_tokens is None:
            return True, None
        return True, parsed

    async def in_flight(self, timeout: float) -> int | None:
        """HTTP requests in flight (`GET /load`, kept by vLLM with --enable-server-load-tracking,
        which the agent sets); None when it does not answer."""
        try:
            async with self._http().get(
                self.base + contract.LOAD_PATH, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                if resp.status != 200:
                    return None
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return None
        value = body.get("server_load") if isinstance(body, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    async def _models(self, timeout: float) -> list[object] | None:
        """The `data` list of `GET /v1/models`; None when the engine did not answer with one."""
        try:
            async with self._http().get(
                self.base + "/v1/models",
                headers=self._auth(),
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                if resp.status != 200:
                    return None
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return None
        data = body.get("data") if isinstance(body, dict) else None
        return data if isinstance(data, list) else None

    async def first_model(self, timeout: float) -> str | None:
        data = await self._models(timeout)
        if data and isinstance(data[0], dict):
            model_id = data[0].get("id")
            return str(model_id) if model_id else None
        return None

    async def lora_adapters(self, timeout: float) -> dict[str, str] | None:
        """The adapters the engine has registered: name → the path it loaded them from (the
        `/v1/models` entries that have a `parent`, their `root`); None when it did not answer."""
        data = await self._models(timeout)
        if data is None:
            return None
        return {
            str(entry["id"]): str(entry.get("root") or "")
            for entry in data
            if isinstance(entry, dict) and entry.get("parent") and entry.get("id")
        }

    async def load_lora(self, name: str, path: str, *, inplace: bool, timeout: float) -> LoraAnswer:
        payload: dict[str, object] = {"lora_name": name, "lora_path": path}
        if inplace:
            payload["load_inplace"] = True
        return await self._lora(contract.LOAD_LORA_PATH, payload, timeout)

    async def unload_lora(self, name: str, timeout: float) -> LoraAnswer:
        return await self._lora(contract.UNLOAD_LORA_PATH, {"lora_name": name}, timeout)

    async def _lora(self, path: str, payload: dict[str, object], timeout: float) -> LoraAnswer:
        try:
            async with self._http().post(
                self.base + path,
                json=payload,
                headers=self._auth(),
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                body = await resp.read()
                return LoraAnswer(resp.status, error_message(body))
        except TimeoutError:
            return LoraAnswer(None, f"no answer within {timeout:g}s")
        except (aiohttp.ClientError, OSError) as exc:
            return LoraAnswer(None, f"{type(exc).__name__}: {exc}")

    async def deep_probe(self, model: str, prompt: str, timeout: float) -> ProbeResult:
        """A real one-token completion through the engine's scheduler."""
        started = time.monotonic()
        payload = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
        try:
            async with self._http().post(
                self.base + "/v1/completions",
                json=payload,
                headers=self._auth(),
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                body = await resp.read()
                if resp.status != 200:
                    snippet = body[:120].decode(errors="replace")
                    return ProbeResult(
                        started,
                        time.monotonic(),
                        False,
                        f"HTTP {resp.status}: {snippet}",
                        engine_dead=resp.status == 500 and ENGINE_DEAD_MESSAGE in body,
                    )
                data = await resp.json(content_type=None)
        except TimeoutError:
            return ProbeResult(
                started, time.monotonic(), False, f"timed out after {timeout:g}s", timed_out=True
            )
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            return ProbeResult(started, time.monotonic(), False, type(exc).__name__)
        except asyncio.CancelledError:
            raise
        choices = data.get("choices") if isinstance(data, dict) else None
        if not choices:
            return ProbeResult(started, time.monotonic(), False, "response without choices")
        finish = choices[0].get("finish_reason") if isinstance(choices[0], dict) else None
        if finish in ("abort", "error"):
            return ProbeResult(started, time.monotonic(), False, f"finish_reason={finish}")
        return ProbeResult(started, time.monotonic(), True)


async def reachable(host: str, port: int, timeout: float) -> bool:
    """Whether a TCP connection to `host:port` opens within `timeout` (a worker's look at its
    leader's rendezvous port; nothing is sent)."""
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError, TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), timeout)
    return True
