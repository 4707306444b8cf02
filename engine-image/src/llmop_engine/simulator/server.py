"""The simulator's HTTP server: vLLM's OpenAI-compatible routes over the batching model.

Routes: `/v1/models`, `/v1/completions`, `/v1/chat/completions` (JSON or SSE streaming),
`/detokenize` (ids to text, as vLLM's: generated ids decode exactly, prompt pieces to ""), `/health`
(200; 503 once crashed), `/ping`, `/version`, `/metrics` (vLLM names), `/load` (in-flight
generation requests, as vLLM's with `--enable-server-load-tracking`), and the simulation controls
`POST|GET /sim/fault` and `GET /sim/stats` (request counts, split by probe vs client traffic; probes
are requests whose User-Agent starts with `llmop-engine-probe`). With `--enable-lora` and
`VLLM_ALLOW_RUNTIME_LORA_UPDATING`, vLLM's runtime LoRA API too (`simulator.lora`): loaded
adapters are listed in `/v1/models` and served as models of their own.

Generation speaks what a router needs to migrate a stream (vLLM ≥ 0.10.2): `return_token_ids`,
token-id prompts (`generation`), output that follows the whole context so a continuation from
`prompt ids + generated ids` is the rest of the run (`tokens`, `decoding`), vLLM's stop rules, and
faults of one request at a chosen token (`X-Sim-Fault`, `request_faults`); the answers' shapes are
`openai_shapes` and `streaming`'s.

Connections like vLLM's under the agent: idle keep-alive connections close after
`VLLM_HTTP_TIMEOUT_KEEP_ALIVE` seconds (5), and once the agent's drain flag exists
(`LLMOP_DRAIN_FLAG`) every response says `Connection: close` and its connection closes after it.

Lifecycle like `vllm serve`: nothing listens during the simulated load time (connection refused,
observed on vLLM 0.32's CPU build). SIGTERM or SIGINT before the server listens (loading, or rank 0
waiting for its group) ends the process at once, as vLLM's start-up handler does
(`setup_interrupt_handler` raises `KeyboardInterrupt("terminated")`, which nothing catches): the
traceback, then Python ends the process by SIGINT (exit status 130; -2 to a parent's `Popen`).
Once serving, SIGTERM with `--shutdown-timeout 0` aborts open requests at once
(`finish_reason: "abort"`) and exits. With N > 0 it finishes running and waiting work for up to N
seconds while new requests get HTTP 500 ("cannot schedule new futures after shutdown"; /health
stays 200), then exits. Work left at that deadline is never answered: the port closes, open
streams get nothing more, and the process does not exit while any of them stays open ("Waiting
for connections to close"). A stream still queued when everything is aborted ends with no choice
and no finish reason, as vLLM's. After a crash `/health` answers 503, open requests end with an
error, and the process exits with code 0.

Multi-node (`--nnodes N`, `simulator.group`): rank 0 waits for the other ranks' rendezvous before
its load time, hangs (the `hang` fault) when one of them is gone and completes no step while one
answers late; `--headless` ranks run no HTTP server, only their side of the rendezvous.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any, NoReturn

from aiohttp import web

from llmop_engine.connection_close import DrainFlag
from llmop_engine.contract import (
    HTTP_KEEP_ALIVE_SECONDS,
    LOAD_LORA_PATH,
    UNLOAD_LORA_PATH,
    Env,
)
from llmop_engine.simulator import decoding, generation, request_faults, tokens
from llmop_engine.simulator.batching import BatchEngine, RequestTooLongError
from llmop_engine.simulator.faults import FaultError, FaultState
from llmop_engine.simulator.group import Rendezvous, run_headless
from llmop_engine.simulator.lora import Answer, LoraRegistry, runtime_updating_allowed, text_shift
from llmop_engine.simulator.metrics import SimMetrics
from llmop_engine.simulator.openai_shapes import Choice, StreamShape, response
from llmop_engine.simulator.sim_config import SimConfig
from llmop_engine.simulator.streaming import END, MORE, Job, Stream
from llmop_engine.simulator.tokens import WORDS

log = logging.getLogger("llmop_engine.simulator")

PROBE_USER_AGENT = "llmop-engine-probe"
VLLM_VERSION = "0.33.0"


def estimate_tokens(text: str) -> int:
    """Roughly four characters per token, as for English with a BPE tokenizer (the simulated
    tokenizer's count: `tokens.encode`)."""
    return max(1, (len(text) + 3) // 4)


def token_text(index: int) -> str:
    """The `index`-th word of the model's vocabulary (`bench/router_replay.py`'s stand-in for an
    answer's text; the model itself picks words from the context, `tokens.next_id`)."""
    return WORDS[index % len(WORDS)]


def _request_id(request: web.Request, body: dict[str, Any], chat: bool) -> str:
    """vLLM's response id: the `X-Request-Id` header, else the body's `request_id`, else random
    (`serve/engine/serving.py::_base_request_id`), after `cmpl-` or `chatcmpl-`."""
    base = request.headers.get("X-Request-Id") or body.get("request_id") or uuid.uuid4().hex
    return f"{'chatcmpl' if chat else 'cmpl'}-{base}"


def _choice(job: Job, cut_at: int | None) -> Choice:
    """A finished prompt's choice of a non-streaming answer; `cut_at`: tokens before a cut."""
    produced, reason = job.req.generated, job.req.finish_reason
    if cut_at is not None:
        produced, reason = min(produced, cut_at), "abort"
    plan = job.plan
    text = "".join(plan.texts[:produced]) + (plan.flush(produced) if reason == "abort" else "")
    return Choice(
        text=text,
        ids=plan.ids[:produced],
        prompt_ids=job.prompt_ids,
        finish=reason,
        stop_reason=plan.stop_reason if reason == "stop" else None,
    )


def _gone(request: web.Request) -> bool:
    """The client closed the connection (nothing was written that would have told us)."""
    return request.transport is None or request.transport.is_closing()


def _error(
    status: int, message: str, kind: str = "BadRequestError", param: str | None = None
) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.json_response(body, status=status)


def _lora_response(answer: Answer) -> web.Response:
    if answer.error_type is None:
        return web.Response(text=answer.message)  # vLLM answers success as plain text
    return _error(answer.status, answer.message, answer.error_type)


class SimServer:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.metrics = SimMetrics(cfg)
        self.faults = FaultState(
            mode="none", slow_factor=cfg.slow_factor, request_fault=cfg.request_fault
        )
        self.engine = BatchEngine(cfg, self.metrics, self.faults)
        self.stats: Counter[str] = Counter()
        self.active_handlers = 0
        self.stop_event = asyncio.Event()
        self.exit_code = 0
        self.started = time.time()
        # What vLLM does with the agent's `--middleware` (llmop_engine.connection_close).
        self.drain_flag = DrainFlag.from_env()
        self.lora = LoraRegistry(cfg.max_lora_rank)
        # vLLM mounts the routes only with both: otherwise they are FastAPI's plain 404.
        self.lora_api = cfg.enable_lora and runtime_updating_allowed()

    # -- app --------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.on_response_prepare.append(self._close_when_draining)
        app.router.add_get("/health", self.health)
        app.router.add_route("*", "/ping", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_get("/metrics", self.prometheus)
        app.router.add_get("/load", self.load)
        app.router.add_post(LOAD_LORA_PATH, self.load_lora)
        app.router.add_post(UNLOAD_LORA_PATH, self.unload_lora)
        app.router.add_get("/sim/stats", self.sim_stats)
        app.router.add_get("/sim/fault", self.get_fault)
        app.router.add_post("/sim/fault", self.post_fault)
        return app

    async def _close_when_draining(
        self, request: web.Request, response: web.StreamResponse
    ) -> None:
        """Once the agent marks the drain, each response says `Connection: close` and the
        connection closes after it, as vLLM with the agent's middleware does."""
        if self.drain_flag.draining():
            # Both: aiohttp (3.14) writes its own Connection header before this hook runs.
            response.force_close()
            response.headers["Connection"] = "close"

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.engine.dead else 200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def models(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        names = self.cfg.served_model_names or (self.cfg.model,)
        data = [
            {
                "id": name,
                "object": "model",
                "created": int(self.started),
                "owned_by": "vllm",
                "root": self.cfg.model,
                "parent": None,
                "max_model_len": self.cfg.max_model_len,
            }
            for name in names
        ]
        data += [
            {
                "id": lora.name,
                "object": "model",
                "created": lora.created,
                "owned_by": "vllm",
                "root": lora.path,
                "parent": self.cfg.served_model_name,
                "max_model_len": None,
            }
            for lora in self.lora.adapters.values()
        ]
        return web.json_response({"object": "list", "data": data})

    async def load_lora(self, request: web.Request) -> web.Response:
        return await self._lora_call(request, self.lora.load)

    async def unload_lora(self, request: web.Request) -> web.Response:
        return await self._lora_call(request, self.lora.unload)

    async def _lora_call(
        self, request: web.Request, call: Callable[[object], Answer]
    ) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        if not self.lora_api:
            return web.json_response({"detail": "Not Found"}, status=404)
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _error(400, "request body is not JSON")
        answer = call(body)
        log.info("%s %s: %d %s", request.path, body, answer.status, answer.message)
        return _lora_response(answer)

    async def prometheus(self, request: web.Request) -> web.Response:
        if self.cfg.disable_log_stats:
            return web.Response(body=b"", content_type="text/plain")
        body = self.metrics.render(
            len(self.engine.running), self.engine.reported_waiting(), self.engine.kv_usage
        )
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})

    async def load(self, request: web.Request) -> web.Response:
        """vLLM's `/load` (with --enable-server-load-tracking): generation requests in flight."""
        return web.json_response({"server_load": self.active_handlers})

    async def sim_stats(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "requestsTotal": self.stats["requests"],
                "probeRequestsTotal": self.stats["probe_requests"],
                "clientRequestsTotal": self.stats["requests"] - self.stats["probe_requests"],
                "running": len(self.engine.running),
                "waiting": len(self.engine.waiting),
                "kvCacheUsage": self.engine.kv_usage,
                "generationTokensTotal": self.engine.generation_tokens_total,
                "steps": self.engine.steps,
                "fault": self.faults.as_json(),
                "shuttingDown": self.engine.shutting_down,
            }
        )

    async def get_fault(self, request: web.Request) -> web.Response:
        return web.json_response(self.faults.as_json())

    async def post_fault(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            if "requestFault" in body:
                self.faults.set_request_fault(str(body["requestFault"] or ""))
            if "mode" in body or "requestFault" not in body:
                factor = body.get("slowFactor")
                self.apply_fault(str(body["mode"]), None if factor is None else float(factor))
        except (ValueError, KeyError, TypeError, FaultError) as exc:
            return _error(400, f"bad fault request: {exc}")
        return web.json_response(self.faults.as_json())

    def apply_fault(self, mode: str, slow_factor: float | None = None) -> None:
        self.faults.set(mode, time.monotonic(), slow_factor)
        log.warning("fault injected: %s", mode)
        if mode == "crash":
            self._crash()
        self.engine.notify()

    def _crash(self) -> None:
        """EngineCore died: open requests end with an error, the server exits a moment later."""
        self.engine.dead = True
        self.engine.abort_all("error")
        self.exit_code = self.cfg.crash_exit_code
        asyncio.get_running_loop().call_later(
            self.cfg.crash_exit_delay_seconds, self.stop_event.set
        )
        self.engine.notify()

    # -- generation -------------------------------------------------------------------------

    def _auth(self, request: web.Request) -> web.Response | None:
        if self.cfg.api_key and request.headers.get("Authorization") != (
            f"Bearer {self.cfg.api_key}"
        ):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return None

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def detokenize(self, request: web.Request) -> web.Response:
        """vLLM's `POST /detokenize` `{"model", "tokens"}` → `{"prompt": text}`."""
        if (denied := self._auth(request)) is not None:
            return denied
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _error(400, "request body is not JSON")
        if not isinstance(body, dict) or not isinstance(body.get("tokens"), list):
            return _error(400, "tokens: a list of token ids is required")
        model = body.get("model")
        if model is not None:
            names = self.cfg.served_model_names or (self.cfg.model,)
            shift = self._model_shift(str(model), names)
            if isinstance(shift, web.Response):
                return shift
        try:
            ids = tokens.check_ids(body["tokens"]) if body["tokens"] else []
        except ValueError as exc:
            return _error(400, str(exc))
        return web.json_response({"prompt": "".join(tokens.word_text(i) for i in ids)})

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:  # noqa: C901
        if (denied := self._auth(request)) is not None:
            return denied
        is_probe = request.headers.get("User-Agent", "").startswith(PROBE_USER_AGENT)
        self.stats["requests"] += 1
        if is_probe:
            self.stats["probe_requests"] += 1
        if self.faults.mode == "refuse":
            return _error(
                503, "The server is refusing requests (simulated fault)", "ServiceUnavailableError"
            )
        if self.engine.dead:
            return _error(500, "EngineCore encountered an issue.", "EngineDeadError")
        if self.engine.shutting_down:
            # vLLM's engine client is shut down once SIGTERM arrived: an internal error, not a 503.
            return _error(500, "cannot schedule new futures after shutdown", "InternalServerError")
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object")
            model = body.get("model") or self.cfg.served_model_name
            names = self.cfg.served_model_names or (self.cfg.model,)
            shift = self._model_shift(str(model), names)
            if isinstance(shift, web.Response):
                return shift
            gen = generation.read(
                body,
                chat=chat,
                default_max_tokens=self.cfg.default_max_tokens,
                block_size=self.cfg.block_size,
            )
            spec = request.headers.get(request_faults.HEADER, self.faults.request_fault)
            faults = request_faults.parse(spec)
            jobs = self._submit(gen, shift, is_probe)
        except RequestTooLongError as exc:
            return _error(400, str(exc))
        except (ValueError, TypeError, json.JSONDecodeError) as exc:
            return _error(400, str(exc))
        fault = request_faults.first(faults, len(jobs[0].prompt_ids))
        rid = _request_id(request, body, chat)
        self.active_handlers += 1
        try:
            if gen.stream:
                shape = StreamShape(chat, rid, int(time.time()), str(model), gen.return_token_ids)
                stream = Stream(
                    shape,
                    jobs,
                    include_usage=gen.include_usage,
                    fault=fault,
                    interval=self.cfg.stream_interval,
                )
                return await self._stream(request, stream)
            return await self._complete(
                request, jobs, gen, chat=chat, model=str(model), rid=rid, fault=fault
            )
        finally:
            self.active_handlers -= 1

    def _submit(self, gen: generation.Generation, shift: int, is_probe: bool) -> list[Job]:
        """One engine request per prompt, its output planned; all or none submitted."""
        jobs: list[Job] = []
        try:
            for prompt in gen.prompts:
                plan = decoding.plan(
                    prompt.ids, gen.max_tokens, gen.spec, shift, self.cfg.eos_probability
                )
                req = self.engine.submit(
                    len(prompt.ids),
                    gen.max_tokens,
                    is_probe=is_probe,
                    prefix=prompt.prefix,
                    stop_after=len(plan.ids) if plan.finish == "stop" else None,
                )
                jobs.append(Job(req, prompt.ids, plan))
        except RequestTooLongError:
            for job in jobs:
                self.engine.abort(job.req)
            raise
        return jobs

    async def _changed(self, jobs: list[Job]) -> None:
        """Until the engine moved one of `jobs`' unfinished requests."""
        waiting = [job.req for job in jobs if not job.req.finished]
        if len(waiting) == 1:
            await waiting[0].changed.wait()
        elif waiting:
            tasks = [asyncio.ensure_future(req.changed.wait()) for req in waiting]
            try:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
        for job in jobs:
            job.req.changed.clear()

    def _model_shift(self, model: str, names: tuple[str, ...]) -> int | web.Response:
        """How far the model's words are shifted from the base's (0: the base), or the error
        answer for a model this engine does not serve."""
        if model in self.lora.adapters:
            if not self.lora.files_present(model):
                return self._lost_lora_files(model)
            return text_shift(model, len(WORDS))
        if model in names:
            return 0
        return _error(
            404,
            f"The model `{model}` does not exist. Valid aliases: {', '.join(names)}.",
            "NotFoundError",
            "model",
        )

    def _lost_lora_files(self, name: str) -> web.Response:
        """vLLM 0.32 re-reads an evicted adapter from its path; with the files gone the worker
        fails, EngineCore dies and the API server exits (measured, reference row 3b)."""
        log.error(
            "EngineCore encountered a fatal error: Worker failed with error 'Loading lora %s "
            "failed: No adapter found for %s'",
            name,
            self.lora.adapters[name].path,
        )
        self._crash()
        return _error(
            500,
            "EngineCore encountered an issue. See stack trace (above) for the root cause.",
            "InternalServerError",
        )

    async def _complete(
        self,
        request: web.Request,
        jobs: list[Job],
        gen: generation.Generation,
        *,
        chat: bool,
        model: str,
        rid: str,
        fault: tuple[str, int] | None,
    ) -> web.StreamResponse:
        if fault is not None and fault[1] >= len(jobs[0].plan.ids):
            fault = None
        try:
            while not all(job.req.finished for job in jobs):
                if fault is not None and jobs[0].req.generated >= fault[1]:
                    break
                await self._changed(jobs)
        except asyncio.CancelledError:
            self._abort(jobs)
            raise
        if fault is not None:
            if fault[0] in ("crash", "hang"):
                return await self._drop(request, jobs, fault[0])
            self._abort(jobs)
            if fault[0] == "error":
                return _error(500, "Internal server error", "InternalServerError")
        return web.json_response(
            response(
                chat=chat,
                rid=rid,
                created=int(time.time()),
                model=model,
                choices=[
                    _choice(job, cut_at=fault[1] if fault and not i else None)
                    for i, job in enumerate(jobs)
                ],
                return_token_ids=gen.return_token_ids,
            )
        )

    async def _stream(self, request: web.Request, stream: Stream) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        try:
            await resp.prepare(request)
            while True:
                events, then = stream.advance()
                if events:
                    await resp.write(events.encode())
                if then == MORE:
                    await self._changed(stream.jobs)
                    continue
                if then in ("crash", "hang"):
                    return await self._drop(request, stream.jobs, then, resp)
                if then != END:
                    self._abort(stream.jobs)  # cut, error: the engine aborts the request
                break
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            self._abort(stream.jobs)
            raise
        return resp

    def _abort(self, jobs: list[Job]) -> None:
        for job in jobs:
            self.engine.abort(job.req)

    async def _drop(
        self,
        request: web.Request,
        jobs: list[Job],
        kind: str,
        resp: web.StreamResponse | None = None,
    ) -> web.StreamResponse:
        """A request fault that leaves the connection without an answer: `crash` closes it at
        once, `hang` keeps it open, silent, until the client (or the server's stop) ends it."""
        log.warning("request fault %s after %d tokens", kind, jobs[0].sent or jobs[0].req.generated)
        if kind == "hang":
            while not _gone(request) and not self.stop_event.is_set():
                await asyncio.sleep(0.05)
        self._abort(jobs)
        if request.transport is not None:
            request.transport.abort()
        # aiohttp ends an answer it cannot write to a closed connection quietly.
        return resp if resp is not None else web.StreamResponse()

    # -- lifecycle --------------------------------------------------------------------------

    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        if not self.cfg.group.multi_node:
            return await self._load_and_serve()
        rendezvous = Rendezvous(self.cfg.group, self._rank_lost, self.engine.stage_late)
        await rendezvous.start()
        try:
            if not await self._until_group_joined(rendezvous):
                log.info("stopped while waiting for the group's other ranks")
                _interrupt_start()
            return await self._load_and_serve()
        finally:
            await rendezvous.close()

    async def _load_and_serve(self) -> int:
        loop = asyncio.get_running_loop()
        # vLLM's own lines for the phases of its start (the agent reads them: startup_log).
        log.info(
            "Starting to load model %s... (simulated loading model, %.1fs)",
            self.cfg.model,
            self.cfg.load_seconds,
        )
        loading = loop.time()
        # Like vLLM, nothing listens until the weights are loaded: clients get connection refused.
        # A SIGTERM meanwhile ends the start, as vLLM's does.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop_event.wait(), self.cfg.load_seconds)
        if self.stop_event.is_set():
            log.info("stopped while loading")
            _interrupt_start()
        log.info("Loading weights took %.2f seconds", loop.time() - loading)
        blocks = self.cfg.num_gpu_blocks
        log.info("GPU KV cache size: %s tokens (simulated)", f"{blocks * self.cfg.block_size:,}")
        log.info("init engine (profile, create kv cache, warmup model) took 0.00 s")
        engine_task = asyncio.create_task(self.engine.run(), name="sim-scheduler")
        runner = web.AppRunner(
            self.app(),
            handle_signals=False,
            access_log=None,
            shutdown_timeout=2.0,
            # vLLM's uvicorn closes idle keep-alive connections after this (aiohttp: 75 s).
            keepalive_timeout=keep_alive_seconds(),
        )
        await runner.setup()
        site = web.TCPSite(runner, self.cfg.host, self.cfg.port, backlog=1024, reuse_address=True)
        await site.start()
        log.info("Starting vLLM server on http://%s:%d", self.cfg.host, self.cfg.port)
        if self.cfg.fault != "none":
            loop.call_later(self.cfg.fault_after_seconds, self.apply_fault, self.cfg.fault)
        await self.stop_event.wait()
        if not self.engine.dead:
            mode = "drain" if self.cfg.shutdown_timeout > 0 else "abort"
            log.info("[shutdown] API server: shutdown triggered")
            log.info("stopping engine client mode=%s timeout=%ss", mode, self.cfg.shutdown_timeout)
            if await self.engine.drain(self.cfg.shutdown_timeout):
                await self._hang_on_open_streams(site)
        # Let handlers write their final chunks before the socket closes.
        deadline = time.monotonic() + 2.0
        while self.active_handlers and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self.engine.stop()
        await runner.cleanup()
        engine_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await engine_task
        log.info("simulator exited (code %d)", self.exit_code)
        return self.exit_code

    async def _until_group_joined(self, rendezvous: Rendezvous) -> bool:
        """Wait for every other rank (vLLM's distributed init); False when stopped first."""
        joined = asyncio.ensure_future(rendezvous.all_joined.wait())
        stopped = asyncio.ensure_future(self.stop_event.wait())
        await asyncio.wait({joined, stopped}, return_when=asyncio.FIRST_COMPLETED)
        for task in (joined, stopped):
            task.cancel()
        return rendezvous.all_joined.is_set()

    def _rank_lost(self, rank: int) -> None:
        """A pipeline stage is gone: as on vLLM, /health stays 200 and nothing completes."""
        self.apply_fault("hang")

    async def _hang_on_open_streams(self, site: web.TCPSite) -> None:
        """vLLM past its shutdown timeout: EngineCore killed, port closed, open streams left
        without another byte, and no exit while any client keeps one open."""
        log.warning(
            "[shutdown] shutdown timeout %ss exceeded with %d requests left; killing EngineCore",
            self.cfg.shutdown_timeout,
            len(self.engine.running) + len(self.engine.waiting),
        )
        self.engine.stop()
        await site.stop()
        log.info("Waiting for connections to close. (CTRL+C to force quit)")
        while self.active_handlers:
            await asyncio.sleep(0.1)


def _interrupt_start() -> NoReturn:
    """A SIGTERM or SIGINT before the server listens, as vLLM 0.33 answers it: its start-up signal
    handler (`setup_interrupt_handler`, replaced once uvicorn runs) raises
    `KeyboardInterrupt("terminated")` and nothing catches it, so Python prints the traceback and
    ends the process by SIGINT. `asyncio.run` cancels the other tasks on the way out."""
    raise KeyboardInterrupt("terminated")


def keep_alive_seconds() -> float:
    """vLLM's idle keep-alive timeout, from its own variable as vLLM reads it."""
    raw = os.environ.get(Env.HTTP_KEEP_ALIVE_SECONDS, "")
    try:
        return float(raw) if raw.strip() else float(HTTP_KEEP_ALIVE_SECONDS)
    except ValueError:
        log.warning(
            "%s=%r is not a number; using %ss",
            Env.HTTP_KEEP_ALIVE_SECONDS,
            raw,
            HTTP_KEEP_ALIVE_SECONDS,
        )
        return float(HTTP_KEEP_ALIVE_SECONDS)


async def _headless(cfg: SimConfig) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return await run_headless(cfg.group, stop)


def run(cfg: SimConfig) -> int:
    if cfg.group.headless:
        return asyncio.run(_headless(cfg))
    return asyncio.run(SimServer(cfg).serve())
