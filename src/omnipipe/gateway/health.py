"""Polls every worker's ``/health`` (read by ``protocol.worker.parse_health``) and folds the replies into the
worker pool."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import httpx

from omnipipe.gateway.pool import WorkerPool
from omnipipe.protocol.worker import HEALTH_PATH, parse_health

logger = logging.getLogger(__name__)


class HealthMonitor:
    """Checks each worker every ``interval_s``; a probe that fails or times out counts as no answer."""

    def __init__(self, pool: WorkerPool, client: httpx.AsyncClient, *, interval_s: float = 2.0,
                 timeout_s: float = 2.0) -> None:
        self.pool = pool
        self.client = client
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="omnipipe-gateway-health")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def check_all(self) -> None:
        """Probe every worker once, concurrently."""
        await asyncio.gather(*(self.check(worker.address) for worker in self.pool.workers))

    async def check(self, address: str) -> None:
        started = self.pool.now()
        try:
            reply = await self.client.get(f"http://{address}{HEALTH_PATH}", timeout=self.timeout_s)
            state, reason, capacity = parse_health(reply.json())
        except (httpx.HTTPError, ValueError) as exc:
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            was_online = self.pool.worker(address).online
            self.pool.apply_health(address, None, False, reason=detail)
            if was_online and not self.pool.worker(address).online:
                logger.warning("worker %s went offline: %s", address, detail)
            return
        previous = self.pool.worker(address).state
        self.pool.apply_health(address, state, True, reason=reason, probe_started_at=started, capacity=capacity)
        if previous is not self.pool.worker(address).state:
            logger.info("worker %s: %s -> %s%s", address, previous.name, self.pool.worker(address).state.name,
                        f" ({reason})" if reason else "")

    async def _run(self) -> None:
        while True:
            try:
                await self.check_all()
            except Exception:  # noqa: BLE001 - the monitor must outlive any one bad reply
                logger.exception("health check round failed")
            await asyncio.sleep(self.interval_s)
