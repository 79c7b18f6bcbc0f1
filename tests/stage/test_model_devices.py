"""Model parts load straight onto their stage's device: transformers parts with a ``device_map`` on CUDA (nothing
changes on the CPU), the default family's decoder reading its weights onto the device."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from omnipipe.models.default.modeling.decoder import CachedDecoder
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


def _decoder_kv_on(device: str) -> SimpleNamespace:
    """What ``CachedDecoder``'s KV methods read of a decoder (2 layers of 2 KV heads of 4 dims, a sliding window of
    4), with its pool made on ``device``."""
    decoder = SimpleNamespace(kv_shape=lambda: (2, 2, 4), dtype=torch.float32, device=torch.device(device), kv=None,
                              sliding_window=4)
    CachedDecoder.use_kv_cache(decoder, 64)  # type: ignore[arg-type]
    return decoder


def test_the_decoders_kv_pool_and_its_steps_live_on_its_device() -> None:
    decoder = _decoder_kv_on("meta")
    kv = decoder.kv
    assert kv.keys[0].device.type == "meta" and kv.reserve("a", 20) and kv.reserve("b", 4)
    kv.bind(["a", "b"], 1)
    keys, values = kv.update(torch.zeros(2, 2, 1, 4, device="meta"), torch.zeros(2, 2, 1, 4, device="meta"), 0)
    local, causal = CachedDecoder.step_masks(decoder, kv.positions())  # type: ignore[arg-type]
    assert keys.device.type == values.device.type == local.device.type == causal.device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_decoders_kv_pool_on_cuda() -> None:
    decoder = _decoder_kv_on("cuda")
    kv = decoder.kv
    kv.reserve("a", 8)
    kv.bind(["a"], 3)
    keys, _ = kv.update(torch.ones(1, 2, 3, 4, device="cuda"), torch.ones(1, 2, 3, 4, device="cuda"), 0)
    assert keys.is_cuda and keys[0, :, :3].eq(1).all()
    local, _ = CachedDecoder.step_masks(decoder, kv.positions())  # type: ignore[arg-type]
    assert local.is_cuda
