"""The words of the spoken answers this server gave, by the ``audio.id`` it gave them.

A chat client that keeps a spoken conversation sends an earlier answer back as ``{"role": "assistant", "audio":
{"id": ...}}`` with no text (as OpenAI documents): the id stands for that answer, so the server must know what was
said. Ids are kept until the answer's ``expires_at``, at most ``MAX_ANSWERS`` of them (the oldest go first); an
id this server never gave, or one that has expired, is a 400 naming the message.
"""

from __future__ import annotations

import time
from collections import OrderedDict

AUDIO_EXPIRY_S = 3600  # what a spoken answer's expires_at promises
MAX_ANSWERS = 10_000


class SpokenAnswers:
    def __init__(self, expiry_s: float = AUDIO_EXPIRY_S, max_answers: int = MAX_ANSWERS) -> None:
        self.expiry_s = expiry_s
        self.max_answers = max_answers
        self._words: OrderedDict[str, tuple[float, str]] = OrderedDict()

    def remember(self, audio_id: str, transcript: str) -> None:
        self._words[audio_id] = (time.monotonic() + self.expiry_s, transcript)
        self._words.move_to_end(audio_id)
        while len(self._words) > self.max_answers:
            self._words.popitem(last=False)

    def words(self, audio_id: str) -> str | None:
        """What the answer ``audio_id`` said, or None if it is unknown or has expired."""
        entry = self._words.get(audio_id)
        if entry is None:
            return None
        if entry[0] < time.monotonic():
            del self._words[audio_id]
            return None
        return entry[1]
