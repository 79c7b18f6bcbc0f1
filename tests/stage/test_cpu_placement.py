"""Deploy ``stages.<name>.cpu``: the stage process pins itself to its cores and lowers its priority at start."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from omnipipe.stage.launch import StageLaunch

PROBE = """
import json, os, sys
from omnipipe.stage.launch import StageLaunch
from omnipipe.stage.stage_core_proc import apply_cpu_placement
apply_cpu_placement(StageLaunch.decode(sys.stdin.buffer.read()))
print(json.dumps({"cores": sorted(os.sched_getaffinity(0)), "nice": os.nice(0)}))
"""


def launch(**cpu: object) -> StageLaunch:
    return StageLaunch(run_id="r", stage="code2wav", kind="generation", runner="x:Y", device="cpu", threads=1,
                       max_num_seqs=1, options={}, ctrl_address="a", out_address="b", abort_address="c",
                       chunk_listen_address=None, chunk_links={}, out_relay="inline", out_inline_threshold_bytes=0,
                       relay_options={}, **cpu)  # type: ignore[arg-type]


def probe(spec: StageLaunch) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE], input=spec.encode(), capture_output=True, check=True)
    return json.loads(done.stdout)


def test_affinity_and_nice_are_applied_in_the_stage_process() -> None:
    core = max(os.sched_getaffinity(0))
    base = os.nice(0)
    seen = probe(launch(cpu_affinity=[core], nice=3))
    assert seen == {"cores": [core], "nice": min(19, base + 3)}


def test_no_placement_leaves_the_process_as_started() -> None:
    seen = probe(launch())
    assert seen == {"cores": sorted(os.sched_getaffinity(0)), "nice": os.nice(0)}
