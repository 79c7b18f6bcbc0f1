"""A stage's CUDA device is refused where this host cannot give it, naming ``stages.<name>.device``."""

from __future__ import annotations

import pytest
import torch

from omnipipe.config.deploy_config import DeployConfigError, load_deploy
from omnipipe.config.deploy_knobs import check_device_present
from omnipipe.models.registry import get_pipeline
from omnipipe.util.field_error import FieldError

TOY = get_pipeline("toy")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_a_cuda_device_without_cuda_is_refused_naming_the_field(device: str) -> None:
    with pytest.raises(DeployConfigError, match=rf"stages\.talker\.device: '{device}' needs a CUDA GPU"):
        load_deploy({"stages": {"talker": {"device": device}}}, TOY)


def test_a_cpu_device_is_never_checked_against_the_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("a CPU stage asked about CUDA"))
    assert load_deploy({"stages": {"talker": {"device": "cpu"}}}, TOY).stages["talker"].device == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_ray_stage_is_checked_where_it_runs_not_on_the_api_host() -> None:
    config = load_deploy({"placement": {"backend": "ray"}, "stages": {"talker": {"device": "cuda:1"}}}, TOY)
    assert config.stages["talker"].device == "cuda:1"


@pytest.mark.parametrize("device", ["cudax", "cuda:", "cuda:-1", "cuda:one", "gpu"])
def test_a_device_name_is_cpu_or_cuda_with_an_index(device: str) -> None:
    with pytest.raises(DeployConfigError, match=r'stages\.talker\.device: must be "cpu" or "cuda\[:N\]"'):
        load_deploy({"stages": {"talker": {"device": device}}}, TOY)


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


@pytest.mark.usefixtures("two_gpus")
def test_a_gpu_index_past_the_hosts_gpus_is_refused() -> None:
    check_device_present("cuda:1", "stages.thinker.device")
    with pytest.raises(FieldError,
                       match=r"'cuda:2' needs cuda:2, and this host has 2 GPU\(s\): cuda:0..cuda:1") as info:
        check_device_present("cuda:2", "stages.thinker.device")
    assert info.value.field == "stages.thinker.device"


@pytest.mark.usefixtures("two_gpus")
def test_every_rank_of_a_tensor_parallel_stage_needs_its_own_gpu() -> None:
    load_deploy({"stages": {"talker": {"device": "cuda", "tensor_parallel_size": 2}}}, TOY)
    with pytest.raises(DeployConfigError,
                       match=r"stages\.talker\.device: 'cuda:1' needs cuda:1..cuda:2 \(one per rank\)"):
        load_deploy({"stages": {"talker": {"device": "cuda:1", "tensor_parallel_size": 2}}}, TOY)
