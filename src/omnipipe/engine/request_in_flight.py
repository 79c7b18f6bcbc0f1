"""What the orchestrator keeps of a request while it is in flight: its route, parameters, session, the stages done
with it, the step data gathered for its non-streaming edges, and its metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omnipipe.engine.route_plan import RoutePlan


@dataclass
class RequestInFlight:
    request_id: str
    route: RoutePlan
    params: dict[str, dict[str, Any]]
    edge_options: dict[str, dict[str, Any]]
    session_id: str | None = None
    done_stages: set[str] = field(default_factory=set)
    forward_data: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    forward_bytes: dict[str, int] = field(default_factory=dict)  # per stage: how big its forward_data came in
    stage_metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    edge_metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
