"""Routing facts of a request, computed once per (entry stage, plan, output modalities) and cached.

For every stage of a plan: whether its text/audio goes to the caller (``emit_final``), whether its step data
goes to the orchestrator to be forwarded whole (``emit_data``), which stages it streams chunks to and from, and
which non-streaming edges the orchestrator forwards when it finishes. ``prewarm``: the stages registered as soon
as the request is added because only streaming edges feed them.
"""

from __future__ import annotations

from dataclasses import dataclass

from omnipipe.config.pipeline_spec import EdgeSpec, PipelineSpec


@dataclass(frozen=True)
class StageRoute:
    emit_final: bool
    emit_data: bool
    chunk_targets: tuple[str, ...]
    chunk_sources: tuple[str, ...]
    forward_edges: tuple[EdgeSpec, ...]


@dataclass(frozen=True)
class RoutePlan:
    entry: str
    stages: tuple[str, ...]  # topological order
    routes: dict[str, StageRoute]
    prewarm: tuple[str, ...]


def streams(edge: EdgeSpec, async_chunk: bool) -> bool:
    """Whether ``edge`` carries chunks stage to stage (rather than a whole output through the orchestrator)."""
    return async_chunk and edge.chunk_processor is not None


def compute_route_plan(pipeline: PipelineSpec, entry: str, plan: list[str], modalities: list[str],
                       async_chunk: bool) -> RoutePlan:
    in_plan = set(plan)
    routes: dict[str, StageRoute] = {}
    prewarm: list[str] = []
    for stage in plan:
        out_edges = [e for e in pipeline.edges_from(stage) if e.target in in_plan]
        in_edges = [e for e in pipeline.edges_into(stage) if e.source in in_plan]
        routes[stage] = StageRoute(
            emit_final=pipeline.stage(stage).final_output in modalities,
            emit_data=any(not streams(e, async_chunk) for e in out_edges),
            chunk_targets=tuple(e.target for e in out_edges if streams(e, async_chunk)),
            chunk_sources=tuple(e.source for e in in_edges if streams(e, async_chunk)),
            forward_edges=tuple(e for e in out_edges if not streams(e, async_chunk)),
        )
        if stage != entry and in_edges and all(streams(e, async_chunk) for e in in_edges):
            prewarm.append(stage)
    return RoutePlan(entry, tuple(plan), routes, tuple(prewarm))


class RoutePlans:
    """The cache: one ``RoutePlan`` per (entry, plan, modalities) of a pipeline and deploy."""

    def __init__(self, pipeline: PipelineSpec, async_chunk: bool) -> None:
        self.pipeline = pipeline
        self.async_chunk = async_chunk
        self._plans: dict[tuple[str, tuple[str, ...], tuple[str, ...]], RoutePlan] = {}

    def get(self, entry: str, plan: list[str], modalities: list[str]) -> RoutePlan:
        key = (entry, tuple(plan), tuple(sorted(modalities)))
        route_plan = self._plans.get(key)
        if route_plan is None:
            route_plan = compute_route_plan(self.pipeline, entry, plan, modalities, self.async_chunk)
            self._plans[key] = route_plan
        return route_plan
