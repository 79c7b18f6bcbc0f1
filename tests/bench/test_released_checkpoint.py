"""``omnipipe tiny-checkpoint --size released``: the released sizes (checked on a meta-device model, nothing
written), a random checkpoint streamed one tensor at a time that safetensors reads back, and the CLI's refusals."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from safetensors import safe_open

from omnipipe.cli.main import main as cli_main
from omnipipe.util import random_checkpoint
from omnipipe.util.random_checkpoint import TensorSpec, write_random_checkpoint


def test_qwen3_released_config_has_the_published_sizes() -> None:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from omnipipe.models.qwen3_omni.weights import tiny

    tokenizer = tiny._tokenizer()
    config = tiny._config(tokenizer, "released")
    text = config.thinker_config.text_config
    assert (text.vocab_size, text.hidden_size, text.num_hidden_layers, text.num_experts) == (152064, 2048, 48, 128)
    assert config.talker_config.code_predictor_config.num_code_groups == 16
    with torch.device("meta"):
        model = Qwen3OmniMoeForConditionalGeneration(config)
    specs = random_checkpoint.checkpoint_specs(model, torch.bfloat16)
    thinker = sum(s.nbytes for s in specs if s.name.startswith("thinker.")) // 2
    assert 30.0e9 < thinker < 32.5e9  # Qwen3-Omni-30B-A3B's thinker: 30.5B parameters
    assert "talker.model.layers.0.mlp.experts.127.down_proj.weight" in {s.name for s in specs}  # as released
    assert tiny._config(tokenizer).thinker_config.text_config.hidden_size == 64  # tiny unchanged


def test_writer_streams_one_tensor_at_a_time(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    specs = [TensorSpec(f"layer.{i}.weight", (64, 32), torch.bfloat16) for i in range(6)]
    specs += [TensorSpec("norm.weight", (32,), torch.bfloat16), TensorSpec("head.bias", (8,), torch.float32)]
    alive: list[weakref.ref] = []
    most_alive = 0
    draw = random_checkpoint.draw

    def counting_draw(*args, **kwargs):
        nonlocal most_alive
        gc.collect()
        most_alive = max(most_alive, sum(1 for ref in alive if ref() is not None) + 1)
        tensor = draw(*args, **kwargs)
        alive.append(weakref.ref(tensor))
        return tensor

    monkeypatch.setattr(random_checkpoint, "draw", counting_draw)
    edits = {"layer.0.weight": lambda rows: rows[3].zero_()}
    files = write_random_checkpoint(tmp_path, specs, seed=1, edits=edits, shard_bytes=3 * 64 * 32 * 2)
    assert most_alive <= 2  # the one being drawn and at most the one just written
    assert len(files) == 3 and (tmp_path / "model.safetensors.index.json").is_file()
    read = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            read.update({key: handle.get_tensor(key) for key in handle.keys()})  # noqa: SIM118
    assert set(read) == {s.name for s in specs}
    assert read["layer.1.weight"].dtype == torch.bfloat16 and 0.01 < read["layer.1.weight"].float().std() < 0.03
    assert torch.all(read["layer.0.weight"][3] == 0) and torch.all(read["norm.weight"] == 1)
    assert torch.all(read["head.bias"] == 0) and read["head.bias"].dtype == torch.float32
    (tmp_path / "again").mkdir()
    again = write_random_checkpoint(tmp_path / "again", specs, seed=1, edits=edits)
    with safe_open(str(again[0]), framework="pt") as handle:
        assert torch.equal(handle.get_tensor("layer.5.weight"), read["layer.5.weight"])  # seeded


def test_cli_refuses_layers_without_released_and_a_family_without_a_released_writer(tmp_path, capsys) -> None:
    assert cli_main(["tiny-checkpoint", "qwen3_omni", str(tmp_path / "a"), "--layers", "2"]) == 2
    assert "--layers" in capsys.readouterr().err
    assert cli_main(["tiny-checkpoint", "qwen2_5_omni", str(tmp_path / "b"), "--size", "released"]) == 2
    assert "no released-size writer" in capsys.readouterr().err
