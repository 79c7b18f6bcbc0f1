"""Route plans of the toy pipeline, with and without async chunk, and the cache."""

from __future__ import annotations

from omnipipe.engine.route_plan import RoutePlans, compute_route_plan
from omnipipe.models.registry import get_pipeline

TOY = get_pipeline("toy")
FULL = ["thinker", "talker", "code2wav"]


def test_async_chunk_streams_every_chunked_edge_and_prewarms_downstream() -> None:
    plan = compute_route_plan(TOY, "thinker", FULL, ["text", "audio"], async_chunk=True)
    thinker, talker, code2wav = (plan.routes[s] for s in FULL)
    assert plan.prewarm == ("talker", "code2wav")
    assert thinker.emit_final and not thinker.emit_data and thinker.chunk_targets == ("talker",)
    assert talker.chunk_sources == ("thinker",) and talker.chunk_targets == ("code2wav",)
    assert not talker.emit_final and not talker.emit_data and not talker.forward_edges
    assert code2wav.emit_final and code2wav.chunk_sources == ("talker",) and not code2wav.chunk_targets


def test_without_async_chunk_the_orchestrator_forwards_whole_outputs() -> None:
    plan = compute_route_plan(TOY, "thinker", FULL, ["text", "audio"], async_chunk=False)
    assert plan.prewarm == ()
    for stage, target in (("thinker", "talker"), ("talker", "code2wav")):
        route = plan.routes[stage]
        assert route.emit_data and not route.chunk_targets and not route.chunk_sources
        assert [e.target for e in route.forward_edges] == [target]
    assert plan.routes["code2wav"].forward_edges == () and not plan.routes["code2wav"].emit_data


def test_a_text_only_plan_keeps_the_thinker_to_itself() -> None:
    plan = compute_route_plan(TOY, "thinker", ["thinker"], ["text"], async_chunk=True)
    route = plan.routes["thinker"]
    assert plan.stages == ("thinker",) and route.emit_final
    assert not route.chunk_targets and not route.emit_data and not route.forward_edges


def test_audio_only_does_not_emit_the_thinkers_text() -> None:
    plan = compute_route_plan(TOY, "thinker", FULL, ["audio"], async_chunk=True)
    assert not plan.routes["thinker"].emit_final and plan.routes["code2wav"].emit_final


def test_plans_are_computed_once_per_key() -> None:
    plans = RoutePlans(TOY, async_chunk=True)
    first = plans.get("thinker", FULL, ["text", "audio"])
    assert plans.get("thinker", FULL, ["audio", "text"]) is first
    assert plans.get("thinker", ["thinker"], ["text"]) is not first
