"""``omnipipe bench hearing``: the words a realtime session hears (its own pass over the turn's speech in a window
fitted to it) against one decode of the whole clip, on spoken questions, per delivery and speed, with every
misheard question listed.

    omnipipe bench hearing [--voices joe,heart] [--speeds 0.8,1.25] [--deliveries steady,varied] [--questions 24]
                           [--json FILE]

The questions: 4 with a thinking pause ("What is the capital of, um," 0.8 s of quiet, "Italy?") and 20 short
factual ones of ``bench quality`` (the paused ones among them, said without the pause). Each is spoken (made once and
cached under ``cache_root()/bench-hearing``) by each of the two packaged voices: ``joe``, the tts pipeline's
(``Omni("tts")``: Piper's ``joe``, a man's voice), and ``heart``, a woman's voice of another make (the
``hibari-tts`` package's bundled voice, Kokoro-distilled, run as that package runs it); at each ``--speeds`` and
each delivery: ``steady`` (the voice's noise fixed: the same samples every run) and ``varied`` (its own noise: a
person saying it a little differently). The speech is resampled to 24 kHz pcm16, as a microphone's audio reaches a
session.

Each clip is heard as a realtime session hears it (``server/routes/realtime/live_transcript.py``): one pass with
the session's extras (``FINAL_EXTRA``: a fitted window) over the speech from 300 ms before it starts (the VAD's
``prefix_padding_ms``) to the 128 ms of quiet after it (where the VAD's pause starts the turn's transcript).
``whole`` is faster-whisper's own decoding of the same audio (what a turn gets without live transcription). Both
are whisper tiny.en as the transcription pipeline loads it (``WhisperASR``, int8, 1 thread).

Columns: ``WER live`` and ``WER whole``: word errors (substitutions, deletions, insertions) over the words said,
case, punctuation, fillers ("um", "uh") and a number said or written not counted; ``Live worse`` / ``Live
better``: questions whose live transcript has more / fewer errors than the whole one. Exit code 1 when the live
path has more errors than the whole clip over all clips.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from omnipipe.bench.quality import QUESTIONS
from omnipipe.bench.report import machine_info, write_json
from omnipipe.bench.second_voice import SECOND_VOICE, second_voice_pcm16
from omnipipe.bench.voice_questions import cut_trailing_quiet
from omnipipe.protocol.audio import PCM16_RATE_HZ
from omnipipe.util.audio import word_error_rate
from omnipipe.util.cache import cache_root

if TYPE_CHECKING:
    from omnipipe.api.omni import Omni

PROG = "omnipipe bench hearing"
PLAIN = 20  # questions of ``bench quality`` spoken whole
# (before the pause, after it): a filler and a thinking pause mid-question
PAUSED: tuple[tuple[str, str], ...] = (
    ("What is the capital of, um,", "Italy?"), ("How many legs does, uh,", "a spider have?"),
    ("Who wrote, um,", "Romeo and Juliet?"), ("What is the largest planet in, um,", "our solar system?"),
)
PAUSE_S = 0.8
PREFIX_PADDING_S = 0.3  # server VAD's default prefix_padding_ms: the turn's speech starts this much early
QUIET_AFTER_S = 0.128  # the pause after which the turn's final pass runs (speculative_start.PAUSE_MS)
FILLERS = frozenset({"um", "uh", "er", "hmm"})
# a number said is a number written
_NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
            "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty")
DELIVERIES = {"steady": {"noise_scale": 0.0, "noise_w": 0.0}, "varied": {}}  # joe's talker options
VOICES = ("joe", SECOND_VOICE)  # the tts pipeline's Piper voice, and hibari-tts's bundled voice


@dataclass(frozen=True)
class SpokenText:
    """A question: the words said, with a pause between its two parts when ``tail`` is given."""

    head: str
    tail: str = ""

    @property
    def text(self) -> str:
        return f"{self.head} {self.tail}".strip()


def questions(count: int) -> list[SpokenText]:
    """``count`` questions: the paused ones, then the first ``PLAIN`` of ``bench quality`` (which hold the paused
    ones said without their pause)."""
    return ([SpokenText(head, tail) for head, tail in PAUSED] + [SpokenText(q.text) for q in QUESTIONS[:PLAIN]])[:count]


def words(text: str) -> list[str]:
    """``text`` as compared: lower case, no punctuation (an apostrophe inside a word kept), numbers as digits."""
    found = re.sub(r"[^\w\s']", " ", text.lower()).split()
    return [str(_NUMBERS.index(w)) if w in _NUMBERS else w for w in found]


def said(text: str) -> list[str]:
    """The words that count: ``words`` without fillers."""
    return [w for w in words(text) if w not in FILLERS]


def word_errors(reference: Sequence[str], heard: Sequence[str]) -> int:
    """Substitutions + deletions + insertions turning ``reference`` into ``heard`` (words as ``said`` gives them)."""
    return round(word_error_rate(" ".join(reference), " ".join(heard)) * max(1, len(reference)))


# ---------------------------------------------------------------------------------------------------- speech
class Speaker:
    """Questions spoken by the packaged voices (``joe``: one ``Omni("tts")`` per delivery; ``heart``: hibari-tts;
    each started on first use), cached."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self._engines: dict[str, Omni] = {}

    def speak(self, text: str, voice: str, delivery: str, speed: float) -> np.ndarray:
        """``text`` in ``voice`` at ``speed``, float32 at 24 kHz, ending at its last speech sample."""
        named = [text, delivery, speed, DELIVERIES[delivery]] if voice == "joe" else [text, voice, delivery, speed]
        key = hashlib.sha256(json.dumps(named).encode()).hexdigest()[:24]
        path = self.cache_dir / f"{key}.pcm"
        if not path.is_file():
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".partial")
            make = self._synthesize if voice == "joe" else self._heart_says
            partial.write_bytes(make(text, delivery, speed))
            partial.replace(path)
        pcm16 = cut_trailing_quiet(path.read_bytes())
        return np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768.0

    @staticmethod
    def _heart_says(text: str, delivery: str, speed: float) -> bytes:
        """The second voice (``second_voice.py``): ``steady`` with its noise seeded, ``varied`` drawn."""
        return second_voice_pcm16(text, speed, seed=0 if delivery == "steady" else None)

    def _synthesize(self, text: str, delivery: str, speed: float) -> bytes:
        from omnipipe.api.omni import Omni
        from omnipipe.api.sampling_params import SamplingParams
        from omnipipe.util.audio import resample

        if delivery not in self._engines:
            print(f"{PROG}: starting the tts pipeline ({delivery} delivery)", file=sys.stderr, flush=True)
            deploy = {"stages": {"talker": {"options": DELIVERIES[delivery]}}} if DELIVERIES[delivery] else None
            self._engines[delivery] = Omni("tts", deploy)
        out = self._engines[delivery].generate({"prompt": text}, {"talker": SamplingParams(extra={"speed": speed})},
                              output_modalities=["audio"], use_tqdm=False)[0]
        if out.audio is None or out.sample_rate_hz is None or not out.audio.size:
            raise RuntimeError(f"the tts pipeline gave no audio for {text!r}")
        audio = resample(out.audio, out.sample_rate_hz, PCM16_RATE_HZ)
        return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()

    def close(self) -> None:
        for engine in self._engines.values():
            engine.shutdown()
        self._engines.clear()


def turn_audio(speaker: Speaker, question: SpokenText, voice: str, delivery: str, speed: float) -> np.ndarray:
    """The turn's speech as the session passes it to transcription (24 kHz, pcm16 values): prefix padding, the
    question (its pause, if any), the quiet before the final pass."""
    parts = [np.zeros(int(PREFIX_PADDING_S * PCM16_RATE_HZ), np.float32),
             speaker.speak(question.head, voice, delivery, speed)]
    if question.tail:
        parts += [np.zeros(int(PAUSE_S * PCM16_RATE_HZ), np.float32),
                  speaker.speak(question.tail, voice, delivery, speed)]
    parts.append(np.zeros(int(QUIET_AFTER_S * PCM16_RATE_HZ), np.float32))
    return np.concatenate(parts)


# ---------------------------------------------------------------------------------------------------- hearing
class Listener:
    """whisper tiny.en as the transcription pipeline runs it: a session's fitted-window pass and a whole-clip
    decode."""

    def __init__(self) -> None:
        from omnipipe.models.default.modeling.whisper import WhisperASR

        self.asr = WhisperASR(num_threads=1)

    def _fitted(self, audio: np.ndarray, extra: dict[str, Any]) -> str:
        """A fitted decode with a session's ``SamplingParams.extra``, as the encoder stage runs it."""
        segment = self.asr.start_fitted(audio, PCM16_RATE_HZ, str(extra.get("prefix", ""))).next_segment()
        return segment.text.strip() if segment is not None else ""

    def live(self, audio: np.ndarray) -> str:
        """The turn's transcript as a session makes it (``FINAL_EXTRA``)."""
        from omnipipe.server.routes.realtime.live_transcript import FINAL_EXTRA

        return self._fitted(audio, FINAL_EXTRA)

    def whole(self, audio: np.ndarray) -> str:
        return self.asr.transcribe(audio, PCM16_RATE_HZ)


@dataclass
class Heard:
    voice: str
    delivery: str
    speed: float
    question: str
    live: str
    whole: str
    live_errors: int
    whole_errors: int
    words: int


def hear(listener: Listener, speaker: Speaker, question: SpokenText, voice: str, delivery: str,
         speed: float) -> Heard:
    audio = turn_audio(speaker, question, voice, delivery, speed)
    live, whole = listener.live(audio), listener.whole(audio)
    reference = said(question.text)
    return Heard(voice, delivery, speed, question.text, live, whole, word_errors(reference, said(live)),
                 word_errors(reference, said(whole)), len(reference))


def format_table(results: list[Heard]) -> str:
    groups: dict[tuple[str, str, float], list[Heard]] = {}
    for r in results:
        groups.setdefault((r.voice, r.delivery, r.speed), []).append(r)
    for voice in dict.fromkeys(r.voice for r in results):
        groups[(voice, "all", 0.0)] = [r for r in results if r.voice == voice]
    groups[("all", "all", 0.0)] = results
    lines = [f"{'Voice':<6} {'Delivery':<9} {'Speed':>5} {'Questions':>9} {'WER live':>9} {'WER whole':>9} "
             f"{'Live worse':>10} {'Live better':>11}"]
    for (voice, delivery, speed), rows in groups.items():
        total = sum(r.words for r in rows)
        live, whole = sum(r.live_errors for r in rows) / total, sum(r.whole_errors for r in rows) / total
        worse = sum(r.live_errors > r.whole_errors for r in rows)
        better = sum(r.live_errors < r.whole_errors for r in rows)
        shown = "" if delivery == "all" else f"{speed:g}"
        lines.append(f"{voice:<6} {delivery:<9} {shown:>5} {len(rows):>9} {live:>9.1%} {whole:>9.1%} {worse:>10} "
                     f"{better:>11}")
    return "\n".join(lines)


def format_misheard(results: list[Heard]) -> str:
    missed = [r for r in results if r.live_errors or r.whole_errors]
    if not missed:
        return "misheard: none"
    lines = ["misheard (errors live / whole):"]
    for r in missed:
        lines.append(f"  {r.voice} {r.delivery} x{r.speed:g} {r.question!r}: live {r.live!r} ({r.live_errors}), "
                     f"whole {r.whole!r} ({r.whole_errors})")
    return "\n".join(lines)


def _floats(value: str) -> list[float]:
    try:
        speeds = [float(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of speeds, got {value!r}") from None
    if not speeds or any(not 0.25 <= s <= 4 for s in speeds):
        raise argparse.ArgumentTypeError(f"speeds in [0.25, 4], got {value!r}")
    return speeds


def _names(known: Sequence[str], what: str) -> Any:
    def parse(value: str) -> list[str]:
        names = [v.strip() for v in value.split(",") if v.strip()]
        if not names or any(n not in known for n in names):
            raise argparse.ArgumentTypeError(f"{what} among {', '.join(known)}, got {value!r}")
        return names
    return parse


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--speeds", type=_floats, default=[0.8, 1.25], help="speaking rates (default 0.8,1.25)")
    parser.add_argument("--voices", type=_names(VOICES, "voices"), default=list(VOICES),
                        help="joe (the tts pipeline's), heart (hibari-tts's bundled voice); default both")
    parser.add_argument("--deliveries", type=_names(list(DELIVERIES), "deliveries"), default=list(DELIVERIES),
                        help="steady (the voice's noise fixed), varied (its own noise); default both")
    parser.add_argument("--questions", type=int, default=PLAIN + len(PAUSED),
                        help=f"how many questions, the {len(PAUSED)} paused ones first (default "
                             f"{PLAIN + len(PAUSED)})")
    parser.add_argument("--cache-dir", type=Path, default=cache_root() / "bench-hearing",
                        help="where the spoken questions are kept")
    parser.add_argument("--json", type=Path, help="write every transcript and the machine to this file")
    args = parser.parse_args(argv)
    if not 1 <= args.questions <= PLAIN + len(PAUSED):
        parser.error(f"--questions: 1 to {PLAIN + len(PAUSED)}")
    chosen = questions(args.questions)
    speaker, listener = Speaker(args.cache_dir), Listener()
    results: list[Heard] = []
    started_s = time.perf_counter()
    try:
        for voice in args.voices:
            for delivery in args.deliveries:
                for speed in args.speeds:
                    for question in chosen:
                        results.append(hear(listener, speaker, question, voice, delivery, speed))
    finally:
        speaker.close()
    print(format_table(results))
    print(format_misheard(results))
    print(f"{len(results)} clips in {time.perf_counter() - started_s:.0f} s", file=sys.stderr)
    if args.json:
        write_json(args.json, {"machine": machine_info(), "results": [asdict(r) for r in results]})
    live_errors, whole_errors = (sum(r.live_errors for r in results), sum(r.whole_errors for r in results))
    return 1 if live_errors > whole_errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
