"""An answer's audio played at real-time pace from its first chunk, and the times playback would have run dry: what
a listener hears as a gap. The realtime server counts them per answer (``omnipipe:realtime_playback_underruns``)
and ``omnipipe bench voice`` per stream, by the same rule."""

from __future__ import annotations

UNDERRUN_GAP_S = 0.02  # a chunk that comes later than this after the audio before it played out is a gap


class PlaybackClock:
    """When all audio received so far will have played, and the underruns: each chunk that came more than
    ``UNDERRUN_GAP_S`` after the chunks before it had played out."""

    def __init__(self) -> None:
        self.ends_at: float | None = None
        self.received_s = 0.0  # audio received so far
        self.gaps: list[tuple[float, float]] = []  # each underrun: (seconds of audio before it, its length)

    @property
    def underruns(self) -> int:
        return len(self.gaps)

    def feed(self, now: float, seconds: float) -> None:
        """``seconds`` of audio arrived at ``now`` (any monotonic clock in seconds)."""
        if self.ends_at is not None and now - self.ends_at > UNDERRUN_GAP_S:
            self.gaps.append((self.received_s, now - self.ends_at))
        self.ends_at = max(self.ends_at or now, now) + seconds
        self.received_s += seconds
