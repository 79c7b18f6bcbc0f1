"""``omnipipe bench voice``'s figures: a run's turns summed up as one row (end of speech -> first audio p50/p99/max,
underruns per answer stream, answers right), the server's own histogram of the same gap read from ``/metrics``
before and after a run, and the table."""

from __future__ import annotations

from typing import Any

from omnipipe.bench.report import format_table, percentile
from omnipipe.bench.voice_questions import answered_right
from omnipipe.bench.voice_session import Turn, audio_seconds

HISTOGRAM = "omnipipe:realtime_speech_end_to_first_audio_seconds"
HEADERS = ["Variant", "Mode", "c", "Turns ok", "Cut", "p50 ms", "p99 ms", "max ms", "Underruns/stream", "Answers right",
           "Server mean ms"]


def server_histogram(exposition: str) -> dict[str, tuple[float, float]]:
    """``turn_end`` -> (count, sum) of the server's end of speech -> first audio histogram in a ``/metrics`` text."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, tuple[float, float]] = {}
    for family in text_string_to_metric_families(exposition):
        if family.name != HISTOGRAM:
            continue
        for sample in family.samples:
            turn_end = sample.labels.get("turn_end", "")
            count, total = out.get(turn_end, (0.0, 0.0))
            if sample.name == f"{HISTOGRAM}_count":
                count += sample.value
            elif sample.name == f"{HISTOGRAM}_sum":
                total += sample.value
            out[turn_end] = (count, total)
    return out


def server_mean_ms(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]],
                   turn_end: str) -> tuple[int, float | None]:
    """The turns the server observed between two scrapes and their mean gap (ms)."""
    count = after.get(turn_end, (0.0, 0.0))[0] - before.get(turn_end, (0.0, 0.0))[0]
    total = after.get(turn_end, (0.0, 0.0))[1] - before.get(turn_end, (0.0, 0.0))[1]
    return int(count), (total / count * 1000.0 if count > 0 else None)


def summarize_turns(variant: str, mode: str, concurrency: int, sessions: list[list[Turn]]) -> dict[str, Any]:
    """One run's row; latencies in ms, None where no turn completed."""
    turns = [t for session in sessions for t in session]
    done = [t for t in turns if t.ok]
    latencies = [t.latency_s * 1000.0 for t in done if t.latency_s is not None]
    heard = [t for t in done if t.heard is not None]
    right = sum(answered_right(t.question.question, t.heard or "") for t in heard)
    per_session = [max((t.latency_s or 0.0) * 1000.0 for t in s if t.ok) if any(t.ok for t in s) else None
                   for s in sessions]
    return {
        "variant": variant, "mode": mode, "concurrency": concurrency, "turns": len(turns), "ok": len(done),
        "cut": sum(t.cut for t in turns),
        "p50_ms": percentile(latencies, 50) if latencies else None,
        "p99_ms": percentile(latencies, 99) if latencies else None,
        "max_ms": max(latencies) if latencies else None,
        "session_max_ms": per_session,
        "underruns_per_stream": sum(t.playback.underruns for t in done) / len(done) if done else None,
        "answers_transcribed": len(heard), "answers_right": right,
        "right_share": right / len(heard) if heard else None,
        "errors": sorted({t.error for t in turns if t.error})[:5],
        "turn_detail": [_turn_detail(t) for t in turns],
    }


def _turn_detail(turn: Turn) -> dict[str, Any]:
    """One turn in ``--json``: its latency, its underruns and where they fell in the answer, what was heard."""
    return {"question": turn.question.question.text,
            "latency_ms": None if turn.latency_s is None else turn.latency_s * 1000.0,
            "underruns": turn.playback.underruns,
            "gaps": [{"after_audio_s": round(at, 3), "gap_ms": round(gap * 1000)} for at, gap in turn.playback.gaps],
            "answer_audio_s": audio_seconds(turn.audio), "heard": turn.heard, "error": turn.error,
            "commits": turn.commits, "cut": turn.cut}


def _ms(value: float | None) -> int | None:
    return None if value is None else round(value)


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The table, and under it each run's errors."""
    table = format_table(HEADERS, [
        [r["variant"], r["mode"], r["concurrency"], f"{r['ok']}/{r['turns']}", r["cut"], _ms(r["p50_ms"]),
         _ms(r["p99_ms"]), _ms(r["max_ms"]), r["underruns_per_stream"],
         f"{r['answers_right']}/{r['answers_transcribed']}", _ms(r["server_mean_ms"])] for r in rows])
    lines = [table]
    for r in rows:
        if r["errors"]:
            lines.append(f"{r['variant']} {r['mode']} c={r['concurrency']}: {r['turns'] - r['ok']} turn(s) failed: "
                         f"{'; '.join(r['errors'])}")
    return "\n".join(lines)
