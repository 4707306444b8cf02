"""The engines' own running and waiting counts, read from their `/metrics` page (vLLM's, and
the simulator's: it is not behind the engine's API key) while this router pod has requests at
them. What the counts mean for the fair queue's slots is for `engine_load` to say."""

from __future__ import annotations

import asyncio

import aiohttp

from llmop_router.engine_load import Reading, parse

MAX_PAGE_BYTES = 4 * 1024 * 1024
"""vLLM's page is ~50-200 KB (histograms per model); a larger answer is not read."""
MAX_ENGINES = 256
"""Engines read per round; the rest keep the plan's slots."""
TIMEOUT_SECONDS = 1.0


class Readings:
    """One HTTP session for reading engines, every `every` seconds."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._session: aiohttp.ClientSession | None = None

    async def read(self, endpoints: list[str]) -> list[Reading | None]:
        """Each endpoint's reading (None: it did not answer in time, or not a page of
        vLLM's), read at once."""
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)
            connector = aiohttp.TCPConnector(limit=64)
            self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        session = self._session
        return list(await asyncio.gather(*(self._one(session, e) for e in endpoints)))

    @staticmethod
    async def _one(session: aiohttp.ClientSession, endpoint: str) -> Reading | None:
        try:
            async with session.get(f"http://{endpoint}/metrics") as answer:
                if answer.status != 200:
                    return None
                page = await answer.content.read(MAX_PAGE_BYTES + 1)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return None
        if len(page) > MAX_PAGE_BYTES:
            return None
        return parse(page.decode("utf-8", "replace"))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
