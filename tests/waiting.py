"""Waiting in tests for something to happen: poll a condition until a deadline, never sleep a fixed time.

``wait_for`` (and ``wait_for_async`` inside an event loop) return as soon as the condition holds, so a fast machine
does not wait, and fail with a message naming what never happened, so a slow one gets a clear error instead of a
flaky assertion. ``wait_until_answers`` is the start-up wait of every server a test spawns: GET a URL until its
answer is accepted, failing at once if the process died.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

T = TypeVar("T")


def _failure(what: str, timeout_s: float, detail: Callable[[], Any] | None) -> AssertionError:
    message = f"waited {timeout_s:g} s, but never: {what}"
    return AssertionError(f"{message} ({detail()})" if detail is not None else message)


def wait_for(condition: Callable[[], T], timeout_s: float, what: str, *, interval_s: float = 0.05,
             detail: Callable[[], Any] | None = None) -> T:
    """Call ``condition()`` until it returns something truthy, and return that; after ``timeout_s`` fail with
    ``what`` (what was expected to happen) and ``detail()`` (what was seen last), if given."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise _failure(what, timeout_s, detail)
        time.sleep(interval_s)


async def wait_for_async(condition: Callable[[], Any], timeout_s: float, what: str, *, interval_s: float = 0.01,
                         detail: Callable[[], Any] | None = None) -> Any:
    """``wait_for`` inside an event loop: the loop runs on between two checks; ``condition`` may be a coroutine
    function."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise _failure(what, timeout_s, detail)
        await asyncio.sleep(interval_s)


def wait_until_answers(url: str, timeout_s: float, what: str, *,
                       accept: Callable[[httpx.Response], bool] | None = None,
                       check_alive: Callable[[], None] | None = None, detail: Callable[[], Any] | None = None,
                       **request: Any) -> httpx.Response:
    """GET ``url`` until it answers and ``accept(response)`` holds (any answer without ``accept``); return that
    answer. No connection yet means not yet; ``check_alive()`` runs before each try and raises if the server died;
    a timeout names ``what``, the last answer and ``detail()`` (say, the server's log). ``request`` goes to
    ``httpx.get`` (``verify=...``, ``headers=...``)."""
    last: list[httpx.Response] = []

    def answered() -> list[httpx.Response]:
        if check_alive is not None:
            check_alive()
        try:
            response = httpx.get(url, timeout=5, **request)
        except httpx.TransportError:
            return []
        last[:] = [response]
        return last if accept is None or accept(response) else []

    def seen() -> str:
        answer = f"last answer: {last[0].status_code} {last[0].text[:300]}" if last else "no answer"
        return answer if detail is None else f"{answer}; {detail()}"

    return wait_for(answered, timeout_s, what, interval_s=0.1, detail=seen)[0]
