"""The ``schedule`` stage option: fifo keeps arrival order; deadline serves the stream whose playback runs dry
soonest, ties by arrival, and never starves one with audio to spare."""

from __future__ import annotations

import pytest

from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput
from omnipipe.stage.schedulers.ar import ARScheduler
from omnipipe.stage.schedulers.generation import GenerationScheduler
from omnipipe.stage.schedulers.service_order import ServiceOrder


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def request(rid: str, arrival_s: float, inputs: int = 3) -> StageRequest:
    r = StageRequest(rid, {}, True, False, [], arrival_s=arrival_s)
    for i in range(inputs):
        r.inputs.append({"i": i})
    r.input_finished = True
    return r


def ids(batch: list[StageRequest]) -> list[str]:
    return [r.request_id for r in batch]


def generation(clock: FakeClock, max_num_seqs: int = 8, **options: object) -> GenerationScheduler:
    return GenerationScheduler(max_num_seqs, dict(options), clock=clock)


def play(scheduler: GenerationScheduler | ARScheduler, clock: FakeClock, r: StageRequest, at_s: float,
         seconds: float) -> None:
    """``r``'s output at ``at_s`` carries ``seconds`` of playback."""
    clock.now = at_s
    scheduler.postprocess(r, RunnerOutput(r.request_id, playback_s=seconds))


def three_streams(scheduler: GenerationScheduler | ARScheduler, clock: FakeClock) -> list[StageRequest]:
    """``rich`` (arrived first, 5 s of audio from t=1: dry at 6), ``short`` (0.5 s from t=1: dry at 1.5) and, at
    t=1.4, ``new`` (no audio yet); the clock then reads 1.45."""
    rich, short, new = request("rich", 0.0), request("short", 0.1), request("new", 1.4)
    for r in (rich, short, new):
        scheduler.add(r)
    play(scheduler, clock, rich, 1.0, 5.0)
    play(scheduler, clock, short, 1.0, 0.5)
    clock.now = 1.45
    return [rich, short, new]


def test_fifo_is_the_default_and_keeps_arrival_order_whatever_the_playback() -> None:
    for options in ({}, {"schedule": "fifo"}):
        clock = FakeClock()
        s = generation(clock, **options)
        three_streams(s, clock)
        batch, _ = s.schedule()
        assert ids(batch) == ["rich", "short", "new"]


def test_deadline_serves_first_audio_then_the_stream_about_to_run_dry() -> None:
    clock = FakeClock()
    s = generation(clock, schedule="deadline")
    three_streams(s, clock)
    batch, _ = s.schedule()
    assert ids(batch) == ["new", "short", "rich"]  # dry (or due) at 1.4, 1.5, 6.0


def test_deadline_a_full_step_takes_the_most_urgent() -> None:
    clock = FakeClock()
    s = generation(clock, max_num_seqs=2, schedule="deadline")
    three_streams(s, clock)
    batch, _ = s.schedule()
    assert ids(batch) == ["new", "short"]
    clock = FakeClock()
    s = generation(clock, max_num_seqs=2)
    three_streams(s, clock)
    assert ids(s.schedule()[0]) == ["rich", "short"]  # fifo: the oldest


def test_deadline_ties_go_by_arrival() -> None:
    clock = FakeClock()
    s = generation(clock, schedule="deadline")
    late, early, no_audio_late, no_audio_early = (request("late", 0.2), request("early", 0.1),
                                                  request("no-audio-late", 0.9), request("no-audio-early", 0.8))
    for r in (late, early, no_audio_late, no_audio_early):
        s.add(r)
    play(s, clock, late, 1.0, 2.0)  # both dry at 3.0
    play(s, clock, early, 2.0, 1.0)
    clock.now = 2.5
    assert ids(s.schedule()[0]) == ["no-audio-early", "no-audio-late", "early", "late"]


def test_deadline_a_stream_with_audio_to_spare_still_runs_when_nothing_is_more_urgent() -> None:
    clock = FakeClock()
    s = generation(clock, schedule="deadline", defer_slack_s=1.0)
    rich = request("rich", 0.0)
    s.add(rich)
    play(s, clock, rich, 1.0, 5.0)
    clock.now = 1.5
    assert ids(s.schedule()[0]) == ["rich"]  # 4.5 s of slack, but no one else: it runs


def test_deadline_defers_audio_to_spare_only_until_its_slack_runs_low() -> None:
    clock = FakeClock()
    s = generation(clock, schedule="deadline", defer_slack_s=1.0)
    rich, short, new = three_streams(s, clock)
    assert ids(s.schedule()[0]) == ["new", "short"]  # rich (4.55 s of slack) waits for them
    for r in (new, short):
        s.postprocess(r, RunnerOutput(r.request_id))  # no playback: their slack stays low
    for r in (new, short):
        r.inputs.append({"i": 9})  # new input keeps them runnable
        s.on_input(r)
    clock.now = 4.0
    assert ids(s.schedule()[0]) == ["new", "short"]  # rich: 2 s of slack left, still to spare
    clock.now = 5.0
    assert ids(s.schedule()[0]) == ["new", "short", "rich"]  # 1 s left: its turn, whatever else is urgent


def test_deadline_forgets_a_finished_request() -> None:
    clock = FakeClock()
    s = generation(clock, schedule="deadline")
    rich, short, new = three_streams(s, clock)
    s.finish(rich)
    s.remove(short.request_id)
    assert s.service.playback == {}


def test_a_runner_that_does_not_say_leaves_deadline_in_arrival_order() -> None:
    clock = FakeClock()
    s = generation(clock, schedule="deadline", defer_slack_s=0.5)
    first, second = request("first", 0.0), request("second", 0.5)
    for r in (second, first):  # added out of arrival order: arrival decides
        s.add(r)
    clock.now = 1.0
    s.postprocess(first, RunnerOutput("first", playback_s=None))
    s.postprocess(second, RunnerOutput("second", playback_s=0.0))  # nothing to play: no playback starts
    for r in (first, second):
        r.inputs.append({"i": 9})
        s.on_input(r)
    assert ids(s.schedule()[0]) == ["first", "second"]


def test_ar_decode_step_serves_by_deadline() -> None:
    clock = FakeClock()
    s = ARScheduler(4, {"schedule": "deadline", "defer_slack_s": 1.0}, clock=clock)
    rich, short, new = request("rich", 0.0), request("short", 0.1), request("new", 1.4)
    s.add(rich)
    s.add(short)
    assert s.schedule() == ([rich, short], True)
    rich.prefilled = short.prefilled = True
    play(s, clock, rich, 1.0, 5.0)
    play(s, clock, short, 1.0, 0.5)
    s.add(new)
    clock.now = 1.45
    assert s.schedule() == ([short], False)  # rich has 4.55 s to spare
    assert s.schedule() == ([new], True)
    new.prefilled = True
    assert s.schedule() == ([new, short], False)
    clock.now = 5.5
    assert s.schedule() == ([new, short, rich], False)


def test_ar_admits_by_arrival_under_deadline_and_in_queue_order_under_fifo() -> None:
    for options, first in (({"schedule": "deadline"}, "early"), ({}, "late")):
        s = ARScheduler(1, options, clock=FakeClock())
        s.add(request("late", 0.5))
        s.add(request("early", 0.2))
        assert ids(s.schedule()[0]) == [first]


def test_ar_fifo_decodes_in_admission_order() -> None:
    clock = FakeClock()
    s = ARScheduler(4, {}, clock=clock)
    streams = three_streams(s, clock)
    s.schedule()
    for r in streams:
        r.prefilled = True
    assert ids(s.schedule()[0]) == ["rich", "short", "new"]


@pytest.mark.parametrize(("options", "key"), [
    ({"schedule": "edf"}, "options.schedule"),
    ({"schedule": "deadline", "defer_slack_s": -1}, "options.defer_slack_s"),
    ({"schedule": "deadline", "defer_slack_s": "1"}, "options.defer_slack_s"),
    ({"defer_slack_s": 1.0}, "options.defer_slack_s"),
    ({"schedule": "deadline", "defer_slack_s": True}, "options.defer_slack_s"),
])
def test_a_bad_schedule_option_names_its_key(options: dict[str, object], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        ServiceOrder(options)
    with pytest.raises(ValueError, match=key):
        ARScheduler(4, options)
