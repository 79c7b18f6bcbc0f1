"""Deploy files are validated at start; every error names the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnipipe.config.deploy_config import DeployConfigError, load_deploy
from omnipipe.config.pipeline_spec import EdgeSpec, PipelineSpec, PipelineSpecError, StageSpec
from omnipipe.models.registry import UnknownPipelineError, get_pipeline

TOY = get_pipeline("toy")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deploy.yaml"
    path.write_text(text)
    return path


def test_defaults_fill_every_stage() -> None:
    config = load_deploy(None, TOY)
    assert set(config.stages) == {"thinker", "talker", "code2wav"}
    assert config.edges["talker->code2wav"].options["codec_chunk_frames"] == 8  # the toy pipeline's own default
    assert config.edge_relay("talker", "code2wav") == ("shm", 64 * 1024)


def test_yaml_overrides_and_per_edge_relay(tmp_path: Path) -> None:
    path = write(tmp_path, """
async_chunk: false
stages:
  thinker: {threads: 2, max_num_seqs: 4, options: {step_delay_ms: 3}}
edges:
  talker->code2wav: {relay: inline, options: {codec_chunk_frames: 25, initial_codec_chunk_frames: 4}}
""")
    config = load_deploy(path, TOY)
    frame_options = config.edges["talker->code2wav"].options
    assert config.async_chunk is False and frame_options["codec_chunk_frames"] == 25
    assert config.stages["thinker"].threads == 2 and config.stages["thinker"].options["step_delay_ms"] == 3
    assert config.edge_relay("talker", "code2wav")[0] == "inline"
    assert frame_options["initial_codec_chunk_frames"] == 4
    assert frame_options["left_context_frames"] == 2  # the toy pipeline's default stays where the file is silent


@pytest.mark.parametrize("text, message", [
    ("max_num_seqs: 3", "deploy.yaml: max_num_seqs: unknown key"),
    ("stages: {thinker: {max_num_seqs: 0}}",
     "deploy.yaml: stages.thinker.max_num_seqs: must be an integer >= 1, got 0"),
    ("stages: {thinker: {threads: two}}", "stages.thinker.threads: must be an integer >= 1"),
    ("stages: {thinker: {device: tpu}}", "stages.thinker.device: must be \"cpu\" or \"cuda[:N]\""),
    ("stages: {thinker: {max_num_seq: 2}}", "stages.thinker.max_num_seq: unknown key"),
    ("stages: {speaker: {}}", "stages.speaker: no such stage in pipeline 'toy'"),
    ("edges: {thinker->code2wav: {relay: shm}}", "edges.thinker->code2wav: no such edge"),
    ("edges: {talker->code2wav: {relay: carrier-pigeon}}", "edges.talker->code2wav.relay: must be one of"),
    ("edges: {talker->code2wav: {relay: local}}", "edges.talker->code2wav.relay: local needs both stages"),
    ("async_chunk: maybe", "async_chunk: must be true or false"),
    ("stages: {thinker: {tensor_parallel_size: 0}}", "stages.thinker.tensor_parallel_size: must be an integer >= 1"),
    ("stages: {thinker: {input_broadcast: eager}}",
     "stages.thinker.input_broadcast: must be one of blocking, async, async_raw, got 'eager'"),
    ("stages: {thinker: {input_broadcast_threshold_bytes: -1}}",
     "stages.thinker.input_broadcast_threshold_bytes: must be an integer >= 0"),
    ("transport: udp", "transport: must be one of ipc, tcp"),
    ("stages: {talker: {cpu: {nice: -1}}}", "stages.talker.cpu.nice: must be an integer in [0, 19]"),
    ("stages: {talker: {cpu: {nice: 20}}}", "stages.talker.cpu.nice: must be an integer in [0, 19]"),
    ("stages: {talker: {cpu: {affinity: []}}}", "stages.talker.cpu.affinity: must be a non-empty list"),
    ("stages: {talker: {cpu: {affinity: 0}}}", "stages.talker.cpu.affinity: must be a non-empty list"),
    ("stages: {talker: {cpu: {affinity: [0, 0]}}}", "stages.talker.cpu.affinity: lists a core twice"),
    ("stages: {talker: {cpu: {affinity: [-1]}}}", "stages.talker.cpu.affinity: must list core numbers"),
    ("stages: {talker: {cpu: {affinity: [100000]}}}", "stages.talker.cpu.affinity: core(s) [100000] are not usable"),
    ("stages: {talker: {cpu: {threads: 1}}}", "stages.talker.cpu.threads: unknown key"),
    ("stages: {talker: {threads: 2, cpu: {affinity: [0]}}}",
     "stages.talker.threads: 2 threads on the 1 core(s) of cpu.affinity [0]"),
    ("edges: {talker->code2wav: {options: {adaptive_chunk: yes please}}}",
     "edges.talker->code2wav.options.adaptive_chunk: must be true or false"),
    ("edges: {talker->code2wav: {options: {adaptive_chunk: true, codec_chunk_frames: 8, max_codec_chunk_frames: 4, "
     "frame_rate_hz: 86}}}",
     "edges.talker->code2wav.options.max_codec_chunk_frames: must be at least codec_chunk_frames"),
    ("edges: {talker->code2wav: {options: {adaptive_chunk: true}}}",
     "edges.talker->code2wav.options.frame_rate_hz: must be > 0 with adaptive_chunk"),
    ("edges: {talker->code2wav: {options: {target_lead_s: -1}}}",
     "edges.talker->code2wav.options.target_lead_s: must be a number >= 0"),
    ("edges: {talker->code2wav: {options: {initial_codec_chunk_frames: 0}}}",
     'edges.talker->code2wav.options.initial_codec_chunk_frames: must be "auto" or an integer in [1, 4096]'),
    ("edges: {talker->code2wav: {options: {chunk_size: 3}}}",
     "edges.talker->code2wav.options.chunk_size: unknown option"),
    ("edges: {thinker->talker: {options: {first_chunk_words: 2}}}",
     "edges.thinker->talker.options: edge thinker->talker takes no options"),
    ("codec_chunk_frames: 25", "codec_chunk_frames: is an option of the frame edge now"),
    ("relay: {backend: shm, shm_num_slots: -1}", "relay.shm_num_slots: must be an integer >= 1"),
    ("relay: {backend: mooncake, mooncake_protocol: udp}", "relay.mooncake_protocol: must be one of tcp, rdma"),
    ("relay: {backend: mooncake, mooncake_slot_bytes: 100}", "relay.mooncake_slot_bytes: must be an integer >= 4096"),
    ("relay: {backend: mooncake, mooncake_num_slots: 0}", "relay.mooncake_num_slots: must be an integer >= 1"),
    ("relay: [1, 2]", "relay: must be a mapping"),
    ("- just\n- a list", "the top level must be a mapping"),
    ("key: [unclosed", "not valid YAML"),
])
def test_invalid_deploy_files_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(DeployConfigError) as excinfo:
        load_deploy(write(tmp_path, text), TOY)
    assert message in str(excinfo.value)
    assert str(tmp_path / "deploy.yaml") in str(excinfo.value)


def test_cpu_placement_is_read_per_stage(tmp_path: Path) -> None:
    import os

    core = min(os.sched_getaffinity(0))
    config = load_deploy(write(tmp_path, f"stages: {{code2wav: {{cpu: {{affinity: [{core}], nice: 5}}}}}}"), TOY)
    assert config.stages["code2wav"].cpu.affinity == [core] and config.stages["code2wav"].cpu.nice == 5
    assert config.stages["talker"].cpu.affinity is None and config.stages["talker"].cpu.nice == 0


def test_missing_deploy_file(tmp_path: Path) -> None:
    with pytest.raises(DeployConfigError, match="deploy file not found"):
        load_deploy(tmp_path / "nope.yaml", TOY)


def test_unknown_pipeline_lists_the_known_ones() -> None:
    with pytest.raises(UnknownPipelineError, match="available: .*toy"):
        get_pipeline("nonexistent")


def test_pipeline_topology_errors() -> None:
    stage = StageSpec("a", "ar", "x:Y", final_output="text")
    with pytest.raises(PipelineSpecError, match="unknown stage 'b'"):
        PipelineSpec("p", "", (stage,), (EdgeSpec("a", "b", "m.f"),), "m.f", ("text",))
    with pytest.raises(PipelineSpecError, match="cycle"):
        PipelineSpec("p", "", (stage, StageSpec("b", "generation", "x:Y")),
                     (EdgeSpec("a", "b", "m.f"), EdgeSpec("b", "a", "m.f")), "m.f", ("text",))
    with pytest.raises(PipelineSpecError, match="must match"):
        PipelineSpec("p", "", (StageSpec("bad-name", "ar", "x:Y"),), (), "m.f", ("text",))


def test_plan_covers_only_the_stages_a_request_needs() -> None:
    assert TOY.plan("thinker", ["text"]) == ["thinker"]
    assert TOY.plan("thinker", ["text", "audio"]) == ["thinker", "talker", "code2wav"]
    assert TOY.plan("thinker", ["audio"]) == ["thinker", "talker", "code2wav"]
    with pytest.raises(ValueError, match="output_modalities: pipeline 'toy' cannot produce 'image'"):
        TOY.plan("thinker", ["image"])


def test_the_deploy_file_offers_every_input_broadcast_mode_the_stage_has() -> None:
    from omnipipe.config.deploy_config import INPUT_BROADCAST_MODES
    from omnipipe.stage.broadcast import MODES

    assert INPUT_BROADCAST_MODES == MODES  # two homes (config must not import torch), one list


# ---------------------------------------------------------------------------------------------- placement
@pytest.mark.parametrize("text, message", [
    ("placement: {backend: slurm}", "placement.backend: must be one of local, ray, got 'slurm'"),
    ("stages: {talker: {node: node_b}}", "stages.talker.node: only means something with placement.backend: ray"),
    ("placement: {node: node_a}", "placement.node: only means something with placement.backend: ray"),
    ("placement: {backend: ray}\nstages: {talker: {resources: {CPU: -1}}}",
     "stages.talker.resources.CPU: must be a number >= 0, got -1"),
    ("placement: {backend: ray}\nstages: {talker: {resources: [1]}}", "stages.talker.resources: must be a mapping"),
    ("placement: {backend: ray}\ntransport: ipc", "transport: placement ray reaches stages on other hosts over tcp"),
    ("placement: {backend: ray, cross_host_relay: carrier-pigeon}", "placement.cross_host_relay: must be one of"),
    ("control_plane_auth: maybe", "control_plane_auth: must be one of curve, none, got 'maybe'"),
])
def test_invalid_placement_names_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(DeployConfigError, match="deploy.yaml: ") as excinfo:
        load_deploy(write(tmp_path, text), TOY)
    assert message in str(excinfo.value)


def test_ray_placement_chooses_relays_by_host(tmp_path: Path) -> None:
    config = load_deploy(write(tmp_path, """
placement: {backend: ray, node: node_a}
stages:
  thinker: {node: node_a}
  talker: {node: node_b, resources: {CPU: 1, node_b: 0.5}}
  code2wav: {node: node_b}
edges:
  thinker->talker: {relay: inline}
"""), TOY)
    assert config.transport == "tcp"  # the default under Ray: other hosts are reached over tcp
    assert config.stages["talker"].resources == {"CPU": 1.0, "node_b": 0.5}
    assert config.edge_relay("talker", "code2wav")[0] == "shm"  # same node
    assert config.edge_relay("thinker", "talker")[0] == "inline"  # the edge names its own
    from omnipipe.config.deploy_config import ORCHESTRATOR
    assert config.relay_between(ORCHESTRATOR, "thinker") == "shm"  # the API process shares node A
    assert config.relay_between("code2wav", ORCHESTRATOR) == "mooncake"
    # a stage with no node may land anywhere: the cross-host relay, both ways
    unpinned = load_deploy({"placement": {"backend": "ray"}, "stages": {"talker": {"node": "node_b"}}}, TOY)
    assert unpinned.relay_between("thinker", "talker") == "mooncake"
    assert load_deploy(None, TOY).relay_between("thinker", "talker") == "shm"  # local placement: one host
