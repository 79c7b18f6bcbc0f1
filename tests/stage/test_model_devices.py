"""Model parts load straight onto their stage's device: transformers parts with a ``device_map`` on CUDA (nothing
changes on the CPU), the default family's decoder reading its weights onto the device."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from omnipipe.models.default.modeling.decoder import LayerCache, gather_cache
from omnipipe.models.default.modeling.qwen2 import Qwen2Thinker
from omnipipe.models.qwen2_5_omni.weights import load as qwen2_5_load
from omnipipe.stage.checkpoint_options import device_on_load


def test_from_pretrained_keywords_load_onto_a_gpu_and_leave_the_cpu_load_as_it_was() -> None:
    assert device_on_load("cuda:1") == {"device_map": "cuda:1"}
    assert device_on_load(torch.device("cuda", 0)) == {"device_map": "cuda:0"}
    assert device_on_load("cpu") == {}


@pytest.mark.parametrize("device, expected", [("cuda:1", {"device_map": "cuda:1"}), ("cpu", {})])
def test_a_qwen2_5_part_is_loaded_onto_its_device(monkeypatch: pytest.MonkeyPatch, device: str,
                                                  expected: dict[str, Any]) -> None:
    from transformers.models.qwen2_5_omni import Qwen2_5OmniToken2WavModel

    seen: dict[str, Any] = {}

    class Loaded:
        def to(self, where: Any) -> Loaded:
            seen["moved_to"] = where
            return self

        def eval(self) -> Loaded:
            return self

    def from_pretrained(directory: Path, **kwargs: Any) -> tuple[Loaded, dict[str, list[str]]]:
        seen.update(kwargs)
        return Loaded(), {"missing_keys": []}

    config = SimpleNamespace(thinker_config=None, talker_config=None, token2wav_config=object())
    monkeypatch.setattr(qwen2_5_load, "load_config", lambda directory: config)
    monkeypatch.setattr(Qwen2_5OmniToken2WavModel, "from_pretrained", from_pretrained)
    qwen2_5_load.load_part(Path("/nowhere"), "token2wav", torch.device(device), torch.float32)
    assert {k: seen[k] for k in ("device_map",) if k in seen} == expected


def test_int8_weights_are_refused_on_a_gpu_before_anything_loads(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="stages.thinker.options.weights: int8 weights run on the CPU only"):
        Qwen2Thinker(tmp_path, weights="int8", device="cuda:0")


def test_a_layer_cache_lives_on_its_device_as_it_grows() -> None:
    cache = LayerCache(2, 4, torch.float32, None, device="meta")
    cache.append(torch.zeros(2, 100, 4, device="meta"), torch.zeros(2, 100, 4, device="meta"))
    assert cache.k.device.type == "meta" and cache.k.shape[1] >= 100
    other = LayerCache(2, 4, torch.float32, None, device="meta")
    keys, values, mask = gather_cache([cache, other], torch.zeros(2, 2, 1, 4, device="meta"),
                                      torch.zeros(2, 2, 1, 4, device="meta"))
    assert keys.device.type == "meta" and mask is not None and mask.device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_decoder_layer_cache_on_cuda() -> None:
    cache = LayerCache(2, 4, torch.float32, None, device="cuda")
    cache.append(torch.ones(2, 3, 4, device="cuda"), torch.ones(2, 3, 4, device="cuda"))
    assert cache.view()[0].is_cuda
