"""Automatic prefix caching for the default family's thinker: the KV caches of the requests that ended, kept by the
tokens they ran through the model, so a new request goes on from the longest token prefix it shares with any of
them and prefills only the rest. A conversation's next turn shares all of the last turn but the answer's end and
the new question; another conversation that opens with the same system prompt and tools shares those.

A request that ends hands its caches over (no copy) and they are kept under its tokens; a kept entry whose tokens
begin the new one's is dropped (the new one serves every prompt it served), and tokens that only begin a kept
entry's are not kept again. A request that goes on from an entry copies its first shared tokens (the entry stays
for others). The kept caches are bounded by a byte budget, the least recently used entry dropped first. An entry
also remembers the sessions whose requests kept it (a realtime session, ``generate(..., session_id=...)``) and
whether a request of no session did: ``end`` drops the entries only that session kept when it ends. Driven from
the stage loop only (not thread-safe).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from omnipipe.models.default.modeling.decoder import KVPrefix, LayerCache


@dataclass
class _Kept:
    token_ids: tuple[int, ...]  # the tokens the caches hold the KV of, in order
    caches: list[LayerCache]
    nbytes: int
    sessions: set[str]  # the sessions whose requests kept it
    anonymous: bool  # a request of no session kept it: no session's end drops it


def common_prefix_length(a: tuple[int, ...] | list[int], b: tuple[int, ...] | list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


class PrefixCache:
    """Kept KV caches by the tokens they hold, within ``budget_bytes``; ``lookup`` -> the longest shared prefix."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._kept: OrderedDict[int, _Kept] = OrderedDict()  # least recently used first
        self._next_key = 0
        self.nbytes = 0

    def lookup(self, token_ids: list[int]) -> KVPrefix | None:
        """A copy of the first tokens of the kept caches that share the most leading tokens with ``token_ids`` (all
        but its last token at most: a prefill runs one at least), for ``CachedDecoder.prefill(continue_from=...)``;
        None when no entry shares a token. The entry is the most recently used one now."""
        best, common = None, 0
        wanted = token_ids[:-1]
        for key, kept in self._kept.items():
            shared = common_prefix_length(kept.token_ids, wanted)
            if shared > common:
                best, common = key, shared
        if best is None:
            return None
        self._kept.move_to_end(best)
        return [cache.copy_first(common) for cache in self._kept[best].caches], common

    def keep(self, token_ids: list[int], caches: list[LayerCache], session_id: str | None = None) -> None:
        """Keep ``caches`` (holding the KV of ``token_ids``), dropping the entries it serves for (their tokens begin
        these), unless an entry holds these tokens and more already; then drop the least recently used entries
        until the budget holds them all (caches larger than the whole budget are not kept)."""
        held = tuple(token_ids)
        nbytes = sum(cache.nbytes for cache in caches)
        if not held or nbytes > self.budget_bytes:
            return
        sessions: set[str] = set() if session_id is None else {session_id}
        anonymous = session_id is None
        for key, kept in list(self._kept.items()):
            if len(kept.token_ids) >= len(held) and kept.token_ids[: len(held)] == held:
                self._kept.move_to_end(key)
                kept.sessions |= sessions
                kept.anonymous = kept.anonymous or anonymous
                return
            if held[: len(kept.token_ids)] == kept.token_ids:  # the new entry serves every prompt this one did
                sessions |= kept.sessions
                anonymous = anonymous or kept.anonymous
                self._drop(key)
        self._kept[self._next_key] = _Kept(held, caches, nbytes, sessions, anonymous)
        self._next_key += 1
        self.nbytes += nbytes
        while self.nbytes > self.budget_bytes:
            self._drop(next(iter(self._kept)))

    def end(self, session_id: str) -> bool:
        """Forget a session: drop what only its requests kept; False if they kept nothing."""
        found = False
        for key, kept in list(self._kept.items()):
            if session_id in kept.sessions:
                found = True
                kept.sessions.discard(session_id)
                if not kept.sessions and not kept.anonymous:
                    self._drop(key)
        return found

    def _drop(self, key: int) -> None:
        self.nbytes -= self._kept.pop(key).nbytes

    def entries(self) -> list[tuple[int, ...]]:
        """The kept token sequences, least recently used first."""
        return [kept.token_ids for kept in self._kept.values()]

    def stats(self) -> dict[str, int]:
        """For ``memory_stats`` (/debug/state): entries kept, the sessions they belong to, and their bytes."""
        sessions = set().union(*(kept.sessions for kept in self._kept.values()))
        return {"prefixes": len(self._kept), "sessions": len(sessions), "prefix_cache_bytes": self.nbytes}
