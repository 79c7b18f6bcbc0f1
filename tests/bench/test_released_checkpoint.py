"""``omnipipe tiny-checkpoint --size released``: the released sizes (checked on a meta-device model, nothing
written), a random checkpoint streamed one tensor at a time that safetensors reads back, a one-layer Qwen2.5-Omni-7B
checkpoint that the family's loader loads and whose thinker writes to max_tokens, and the CLI's refusals."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

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


@pytest.mark.slow  # writes released-size tensors (~8 s): out of make test-fast
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


def test_cli_refuses_layers_without_released(tmp_path, capsys) -> None:
    assert cli_main(["tiny-checkpoint", "qwen3_omni", str(tmp_path / "a"), "--layers", "2"]) == 2
    assert "--layers" in capsys.readouterr().err
    released = ["--size", "released", "--layers", "0"]
    assert cli_main(["tiny-checkpoint", "qwen2_5_omni", str(tmp_path / "b"), *released]) == 2
    assert "--layers" in capsys.readouterr().err


def test_qwen2_5_released_config_has_the_published_sizes() -> None:
    from transformers.models.qwen2_5_omni import Qwen2_5OmniForConditionalGeneration

    from omnipipe.models.qwen2_5_omni.weights import tiny

    ids = {token: 151643 + i for i, token in enumerate(tiny.SPECIAL_TOKENS)}
    config = tiny._config(ids, "released")
    text, talker = config.thinker_config.text_config, config.talker_config
    assert (text.vocab_size, text.hidden_size, text.num_hidden_layers, text.intermediate_size) == (152064, 3584, 28,
                                                                                                 18944)
    assert (config.thinker_config.vision_config.hidden_size, config.thinker_config.audio_config.d_model) == (1280, 1280)
    assert (talker.vocab_size, talker.hidden_size, talker.num_hidden_layers, talker.embedding_size) == (8448, 896, 24,
                                                                                                      3584)
    dit, bigvgan = config.token2wav_config.dit_config, config.token2wav_config.bigvgan_config
    assert (dit.hidden_size, dit.num_hidden_layers, bigvgan.upsample_initial_channel) == (1024, 22, 1536)
    with torch.device("meta"):
        model = Qwen2_5OmniForConditionalGeneration(config)
    specs = random_checkpoint.checkpoint_specs(model, torch.bfloat16)
    total = sum(s.nbytes for s in specs) // 2
    print(f"Qwen2.5-Omni-7B at the released sizes: {total / 1e9:.3f}B parameters")
    assert 10.6e9 < total < 10.8e9  # Qwen2.5-Omni-7B: 10.7B parameters (thinker 8.9B, talker 1.35B, token2wav 0.45B)
    assert {"thinker.lm_head.weight", "talker.codec_head.weight"} <= {s.name for s in specs}  # untied, as released
    assert tiny._config(ids).thinker_config.text_config.hidden_size == 64  # tiny unchanged


@pytest.fixture(scope="module")
def qwen2_5_one_layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen2.5-Omni-7B-wide checkpoint with one layer a stack (3 GB in bfloat16; ~30 s and ~5 GB to write)."""
    directory = tmp_path_factory.mktemp("qwen2_5-released") / "ckpt"
    assert cli_main(["tiny-checkpoint", "qwen2_5_omni", str(directory), "--size", "released", "--layers", "1"]) == 0
    return directory


@pytest.mark.slow  # a 3 GB one-layer checkpoint of the released widths
def test_qwen2_5_one_layer_checkpoint_loads_part_by_part(qwen2_5_one_layer: Path) -> None:
    from omnipipe.models.qwen2_5_omni.weights.load import load_part, load_speakers

    talker = load_part(qwen2_5_one_layer, "talker", torch.device("cpu"), torch.bfloat16)
    assert len(talker.model.layers) == 1 and talker.config.hidden_size == 896
    head = talker.codec_head.weight
    assert torch.all(head[8193:] == 0) and bool(head[:8193].abs().sum(dim=1).gt(0).all())  # codec end: 8294
    del talker
    token2wav = load_part(qwen2_5_one_layer, "token2wav", torch.device("cpu"), torch.float32)
    assert len(token2wav.code2wav_dit_model.transformer_blocks) == 1
    del token2wav
    speaker = next(iter(load_speakers(qwen2_5_one_layer).values()))
    assert tuple(speaker["cond"].shape) == (1, 192)  # the DiT's speaker condition width (enc_emb_dim)


@pytest.mark.slow  # a 3 GB one-layer checkpoint of the released widths
def test_qwen2_5_one_layer_thinker_writes_to_max_tokens(qwen2_5_one_layer: Path) -> None:
    from omnipipe.models.qwen2_5_omni.runners.thinker import Qwen25ThinkerRunner
    from omnipipe.stage.request import StageRequest
    from omnipipe.stage.runner import RunnerContext

    runner = Qwen25ThinkerRunner(RunnerContext("thinker", "cpu", 1, 1, {"model": str(qwen2_5_one_layer),
                                                                        "dtype": "bfloat16"}))
    runner.load()
    assert runner.model.config.text_config.hidden_size == 3584 and runner.eos_ids  # the end tokens it would stop at
    request = StageRequest("r", {"temperature": 0.0, "max_tokens": 8}, emit_final=True, emit_data=True,
                           chunk_targets=[])
    request.inputs.append({"text": "hello", "history": [], "images": [], "audios": [], "videos": []})
    out, steps = None, 0
    while out is None or not out.finished:
        (out,) = runner.execute([request])
        steps += 1
    generated = list(request.runner_state.generated)
    assert out.finish_reason == "length" and len(generated) == 8
    assert not runner.eos_ids & set(generated) and max(generated) < len(runner.tokenizer)  # tokens that decode
    runner.close()
