"""RequestClock: how a sequential request's E2E splits into hops, from the stamps its stages report, and the prompt
tokens (and cached ones) its usage counts."""

from __future__ import annotations

from omnipipe.api.metrics import RequestClock


def clock_at(start_s: float) -> RequestClock:
    clock = RequestClock()
    clock.start_s = start_s
    return clock


def test_hops_run_from_each_sender_stamp_to_the_next_receiver_stamp() -> None:
    stages = {"a": {"arrived_at_s": 10.5, "sent_at_s": 12.0}, "b": {"arrived_at_s": 12.25, "sent_at_s": 15.0}}
    hops = clock_at(10.0).hops(["a", "b"], stages, end_s=16.0)
    assert hops == {"caller->a": 0.5, "a->b": 0.25, "b->caller": 1.0}


def test_overlapping_stages_or_missing_stamps_give_no_hops() -> None:
    overlapping = {"a": {"arrived_at_s": 10.5, "sent_at_s": 12.0}, "b": {"arrived_at_s": 10.6, "sent_at_s": 15.0}}
    assert clock_at(10.0).hops(["a", "b"], overlapping, end_s=16.0) == {}  # b was fed before a finished
    missing = {"a": {"arrived_at_s": 10.5, "sent_at_s": 12.0}, "b": {"compute_s": 1.0}}
    assert clock_at(10.0).hops(["a", "b"], missing, end_s=16.0) == {}


def test_finish_reports_hops_only_with_the_plan() -> None:
    clock = RequestClock()
    clock.start_s -= 1.0  # the stage's stamps lie well before finish(), however soon it runs
    stages = {"a": {"arrived_at_s": clock.start_s + 1e-6, "sent_at_s": clock.start_s + 2e-6}}
    assert list(clock.finish(stages, {}, ["a"]).hops_s) == ["caller->a", "a->caller"]
    assert clock.finish(stages, {}).hops_s == {}


def test_a_requests_cached_tokens_are_those_of_the_stages_whose_prompt_tokens_it_counts() -> None:
    """A talker's prompt is made of the thinker's: what it shares in its own prefix cache is in its stage's figures,
    never in the request's usage (cached_tokens at most prompt_tokens)."""
    stages = {"thinker": {"prompt_tokens": 40, "cached_prompt_tokens": 32},
              "talker": {"prompt_tokens": 0, "cached_prompt_tokens": 48}}
    metrics = RequestClock().finish(stages, {})
    assert (metrics.num_prompt_tokens, metrics.num_cached_tokens) == (40, 32)
