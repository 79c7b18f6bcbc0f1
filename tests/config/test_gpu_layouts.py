"""GPU layouts checked when the engine starts: every deploy layout README shows loads, and the ones a GPU can never
run (an nccl edge with both ends on one GPU or one on the CPU, shares of one GPU past the whole) are refused before
any stage starts, naming the key and the numbers. torch is told of two GPUs: the check reads the layout only."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from omnipipe.config.deploy_config import DeployConfigError, load_deploy
from omnipipe.models.registry import get_pipeline

README = Path(__file__).resolve().parents[2] / "README.md"
MODEL = {"model": "/models/Qwen3-Omni-30B-A3B-Instruct"}


@pytest.fixture(autouse=True)
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def readme_layouts() -> list[tuple[str, dict[str, Any]]]:
    """(pipeline, deploy) of each YAML block in README: the pipeline its `--pipeline` names, else the default."""
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S)
    named = [re.search(r"--pipeline (\S+)", block) for block in blocks]
    return [(m.group(1) if m else "default", yaml.safe_load(block)) for m, block in zip(named, blocks, strict=True)]


def test_readme_shows_gpu_layouts_of_both_qwen_families() -> None:
    gpu = [pipeline for pipeline, deploy in readme_layouts()
           if any(str(s.get("device", "")).startswith("cuda") for s in (deploy.get("stages") or {}).values())]
    assert {"qwen3_omni", "qwen2_5_omni"} <= set(gpu) and len(gpu) >= 3


@pytest.mark.parametrize(("pipeline", "deploy"), readme_layouts())
def test_every_layout_in_readme_loads(pipeline: str, deploy: dict[str, Any]) -> None:
    load_deploy(deploy, get_pipeline(pipeline))


def qwen3(devices: tuple[str, str, str], fractions: tuple[float | None, ...] = (None, None, None),
          **top: Any) -> dict[str, Any]:
    stages = {}
    for name, device, fraction in zip(("thinker", "talker", "code2wav"), devices, fractions, strict=True):
        options = dict(MODEL, **({} if fraction is None else {"gpu_memory_fraction": fraction}))
        stages[name] = {"device": device, "options": options}
    return {"stages": stages, **top}


@pytest.mark.parametrize(("deploy", "message"), [
    (qwen3(("cuda:0", "cuda:1", "cuda:1"), relay={"backend": "nccl"}),
     "relay.backend: nccl needs the two ends of edge talker->code2wav on two GPUs, and talker and code2wav both "
     "run on cuda:1: set this edge's relay to shm (edges.talker->code2wav.relay: shm)"),
    (qwen3(("cuda", "cuda:0", "cpu"), edges={"thinker->talker": {"relay": "nccl"}}),
     "edges.thinker->talker.relay: nccl needs the two ends of edge thinker->talker on two GPUs, and thinker and "
     "talker both run on cuda:0"),
    (qwen3(("cuda:0", "cuda:1", "cpu"), edges={"talker->code2wav": {"relay": "nccl"}}),
     "edges.talker->code2wav.relay: nccl moves tensors between GPUs, and stage code2wav of edge talker->code2wav "
     "runs on the CPU: use shm for this edge"),
    (qwen3(("cuda:0", "cuda:0", "cuda:0"), (0.8, 0.15, 0.1)),
     "stages.code2wav.options.gpu_memory_fraction: the stages on cuda:0 ask for 0.8 (thinker) + 0.15 (talker) + "
     "0.1 (code2wav) = 1.05 of its memory: their shares must add up to at most 1"),
], ids=["nccl on one gpu (relay.backend)", "nccl on one gpu (the edge's relay)", "nccl to the cpu",
        "shares past one gpu"])
def test_a_layout_a_gpu_cannot_run_is_refused_naming_the_key(deploy: dict[str, Any], message: str) -> None:
    with pytest.raises(DeployConfigError, match=re.escape(message)):
        load_deploy(deploy, get_pipeline("qwen3_omni"))


def test_shares_are_counted_per_gpu() -> None:
    load_deploy(qwen3(("cuda:0", "cuda:1", "cuda:1"), (0.9, 0.7, 0.3), edges={"thinker->talker": {"relay": "nccl"}}),
                get_pipeline("qwen3_omni"))
