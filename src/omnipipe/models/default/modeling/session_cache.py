"""Each session's KV cache kept between its requests (a conversation's turns): a new request of the session goes on
from the longest common token prefix of its prompt and what the session's last request ran through the model, so
its prefill runs only the rest (in a conversation: the answer's end and the new question).

One cache per session: a request that ends replaces the one before, and a request takes its session's cache over
(a second request of the session running at the same time starts without it). The kept caches are bounded by a
byte budget: the least recently kept sessions are dropped first, and ``end`` drops a session's at once. Driven from
the stage loop only (not thread-safe).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from omnipipe.models.default.modeling.decoder import KVPrefix, LayerCache


@dataclass
class _Kept:
    token_ids: list[int]  # the tokens the caches hold the KV of, in order
    caches: list[LayerCache]
    nbytes: int


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


class SessionCache:
    """Session id -> the KV caches of its last request and the tokens they hold, within ``budget_bytes``."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._kept: OrderedDict[str, _Kept] = OrderedDict()  # least recently kept first
        self.nbytes = 0

    def take(self, session_id: str, token_ids: list[int]) -> KVPrefix | None:
        """The session's caches cut to the longest common prefix of their tokens and ``token_ids`` (all but its last
        token at most: a prefill runs one at least), for ``CachedDecoder.prefill(continue_from=...)``. The session
        no longer holds them. None when it holds none, or they share no token."""
        kept = self._kept.pop(session_id, None)
        if kept is None:
            return None
        self.nbytes -= kept.nbytes
        common = common_prefix_length(kept.token_ids, token_ids[:-1])
        if common == 0:
            return None
        for cache in kept.caches:
            cache.truncate(common)
        return kept.caches, common

    def keep(self, session_id: str, token_ids: list[int], caches: list[LayerCache]) -> None:
        """Keep ``caches`` (holding the KV of ``token_ids``) as the session's, in place of any before; then drop the
        least recently kept sessions until the budget holds them all (a cache larger than the budget is not kept)."""
        self.end(session_id)
        nbytes = sum(cache.nbytes for cache in caches)
        if nbytes > self.budget_bytes:
            return
        self._kept[session_id] = _Kept(list(token_ids), caches, nbytes)
        self.nbytes += nbytes
        while self.nbytes > self.budget_bytes:
            _, oldest = self._kept.popitem(last=False)
            self.nbytes -= oldest.nbytes

    def end(self, session_id: str) -> bool:
        """Drop the session's caches; False if it held none."""
        kept = self._kept.pop(session_id, None)
        if kept is None:
            return False
        self.nbytes -= kept.nbytes
        return True

    def sessions(self) -> list[str]:
        """The sessions holding a cache, least recently kept first."""
        return list(self._kept)

    def stats(self) -> dict[str, int]:
        """For ``memory_stats`` (/debug/state): sessions held and the bytes of their caches."""
        return {"sessions": len(self._kept), "session_cache_bytes": self.nbytes}
