"""The malformed requests of ``bench/malformed.py`` sent under the soak's load, and what the server answered."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import httpx

from omnipipe.bench.malformed import Case, malformed_cases


async def run_malformed(client: httpx.AsyncClient, cases: Sequence[Case], rounds: int, headers: dict[str, str],
                        timeout_s: float) -> list[dict[str, Any]]:
    """Every case, ``rounds`` times, one at a time; the answer's status (None: no answer) and a 5xx's body."""
    results: list[dict[str, Any]] = []
    for round_index in range(rounds):
        for case in cases:
            entry: dict[str, Any] = {"case": case.name, "round": round_index, "status": None,
                                     "expected": case.status, "feature": case.feature}
            try:
                response = await asyncio.wait_for(client.request(**case.request_args(headers)), timeout_s)
                entry["status"] = response.status_code
                if response.status_code >= 500:
                    entry["body"] = response.text[:1000]
            except TimeoutError:
                entry["error"] = f"no answer within {timeout_s:g} s"
            except httpx.HTTPError as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}"
            results.append(entry)
            await asyncio.sleep(0.05)
    return results


def _stage_down(result: dict[str, Any]) -> bool:
    """A well-formed request (one the server must accept, or a feature case a pipeline with the feature serves)
    answered 503 ``stage_unavailable``: it met a stage the soak had just killed or stopped, which is the right answer
    then, not a malformed input breaking the server."""
    if result["status"] != 503 or (result.get("expected", 500) >= 300 and not result.get("feature")):
        return False
    try:
        return json.loads(result.get("body") or "{}")["error"]["code"] == "stage_unavailable"
    except (ValueError, KeyError, TypeError):
        return False


def malformed_summary(results: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    sent = len(results)
    down = [r for r in results if _stage_down(r)]
    results = [r for r in results if not _stage_down(r)]
    codes = [r["status"] for r in results]
    server_errors: dict[str, dict[str, Any]] = {}
    for r in results:
        if r["status"] is not None and r["status"] >= 500:
            entry = server_errors.setdefault(r["case"], {"case": r["case"], "status": r["status"], "count": 0,
                                                        "body": r.get("body")})
            entry["count"] += 1
    return {"rounds": rounds, "requests": sent,
            "2xx": sum(1 for c in codes if c is not None and c < 300),
            "4xx": sum(1 for c in codes if c is not None and 400 <= c < 500),
            "5xx": sum(1 for c in codes if c is not None and c >= 500),
            "other": sum(1 for c in codes if c is not None and 300 <= c < 400),
            "no_answer": [f"{r['case']}: {r.get('error')}" for r in results if r["status"] is None],
            "server_errors": list(server_errors.values()),
            "stage_down": len(down)}


def malformed_list(model: str, max_body_bytes: int, api_key: bool) -> list[Case]:
    """The shared list; without an API key on the server, the cases about the key mean nothing and are left out."""
    cases = malformed_cases(model, max_body_bytes)
    if api_key:
        return cases
    return [c for c in cases if c.auth and "Authorization" not in c.headers]
