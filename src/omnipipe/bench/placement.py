"""``omnipipe bench placement``: what it costs to split a pipeline over two hosts. The same prompts through the
engine with every stage on this host (local placement) and with the stages on two Ray nodes (a loopback cluster
of two nodes started here: the thinker's side on node A, the talker and vocoder on node B, the edges between them
through the cross-host relay), at each concurrency, with the ratio two nodes / one host.

    omnipipe bench placement                                   # default pipeline, 8 prompts, c=1,4
    omnipipe bench placement --cross-host-relay shm --num-prompts 20

On one machine the two "hosts" share its cores, so the figures are the framework's cost of the hop (tcp control
plane with CURVE, the cross-host relay, actors), not a network's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from typing import Any

from omnipipe.bench.offline import _engine_rows
from omnipipe.bench.prompts import QUESTIONS
from omnipipe.bench.report import format_table, machine_info, write_json
from omnipipe.models.registry import get_pipeline

NODE_A, NODE_B = "node_a", "node_b"
# which side of the split each stage of the packaged pipelines goes to (a stage not named goes to node A)
ON_NODE_B = ("talker", "code2wav")


def split_deploy(pipeline: str, address: str, cross_host_relay: str) -> dict[str, Any]:
    stages = {stage: {"node": NODE_B if stage in ON_NODE_B else NODE_A}
              for stage in get_pipeline(pipeline).stage_names}
    return {"placement": {"backend": "ray", "address": address, "node": NODE_A,
                          "cross_host_relay": cross_host_relay}, "stages": stages}


def run(pipeline: str, prompts: list[str], concurrencies: list[int], max_tokens: int,
        cross_host_relay: str) -> dict[str, Any]:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from ray.cluster_utils import Cluster

    local = asyncio.run(_engine_rows(pipeline, True, prompts, concurrencies, max_tokens))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": os.cpu_count(), "resources": {NODE_A: 1}})
    try:
        cluster.add_node(num_cpus=os.cpu_count(), resources={NODE_B: 1})
        deploy = split_deploy(pipeline, cluster.address, cross_host_relay)
        split = asyncio.run(_engine_rows(pipeline, True, prompts, concurrencies, max_tokens, deploy))
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
    for row in local:
        row["placement"] = "one host"
    for row in split:
        row["placement"] = f"two Ray nodes ({cross_host_relay} between them)"
    return {"pipeline": pipeline, "rows": [*local, *split], "cross_host_relay": cross_host_relay}


def format_report(data: dict[str, Any]) -> str:
    def m(row: dict[str, Any], name: str, stat: str = "mean") -> float | None:
        return row[name][stat] if row.get(name) else None

    rows = data["rows"]
    table = format_table(
        ["Placement", "Conc.", "Prompts", "TTFP mean (ms)", "TTFP p50 (ms)", "TTFT mean (ms)", "E2E mean (ms)",
         "req/s"],
        [[r["placement"], r["concurrency"], r["prompts"], m(r, "ttfp"), m(r, "ttfp", "median"), m(r, "ttft"),
          m(r, "e2e"), r["throughput_rps"]] for r in rows],
        title=f"{data['pipeline']} pipeline, async chunk on: one host vs two Ray nodes (loopback)")
    lines = [table]
    half = len(rows) // 2
    for here, there in zip(rows[:half], rows[half:], strict=False):
        if m(here, "ttfp") and m(there, "ttfp"):
            lines.append(f"TTFP two nodes / one host at concurrency {here['concurrency']}: "
                         f"{m(there, 'ttfp') / m(here, 'ttfp'):.3f} (mean), "
                         f"{m(there, 'ttfp', 'median') / m(here, 'ttfp', 'median'):.3f} (p50); "
                         f"req/s {there['throughput_rps'] / here['throughput_rps']:.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnipipe bench placement", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipeline", default="default")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--concurrency", default="1,4", help="comma-separated, e.g. 1,4")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--cross-host-relay", default="mooncake", help="the relay between the two nodes")
    parser.add_argument("--json", help="also write the raw figures here")
    args = parser.parse_args(argv)
    try:
        concurrencies = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        parser.error(f"--concurrency: comma-separated integers, got {args.concurrency!r}")
    if args.num_prompts < 1 or any(c < 1 for c in concurrencies):
        parser.error("--num-prompts and --concurrency must be >= 1")
    prompts = [QUESTIONS[i % len(QUESTIONS)] for i in range(args.num_prompts)]
    print(f"omnipipe bench placement: {args.pipeline}, {len(prompts)} prompts at concurrency {concurrencies}, "
          f"cross-host relay {args.cross_host_relay}", file=sys.stderr)
    data = run(args.pipeline, prompts, concurrencies, args.max_tokens, args.cross_host_relay)
    print(format_report(data))
    if args.json:
        write_json(args.json, {"meta": {"machine": machine_info()}, "placement": data})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
