"""The token sampler every autoregressive stage uses (``stage/sampling.py``): settings checked naming the field,
seeded draws reproducible, filters and penalties as documented, every valid setting usable, and the prompt's tokens
penalised for repetition only."""

from __future__ import annotations

import pytest
import torch

from omnipipe.stage.sampling import TokenSamplingParams, sample_next_token


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("top_k", 2.5),
        ("repetition_penalty", 0.0),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -3.0),
        ("seed", -1),
        ("seed", "42"),
    ],
)
def test_sampling_validation_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        TokenSamplingParams(**{field: value})


def _logits(vocab: int = 1000, seed: int = 0) -> torch.Tensor:
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_seeded_sampling_is_reproducible() -> None:
    logits = _logits()
    params = TokenSamplingParams(temperature=1.0, top_p=0.9, top_k=100, seed=7)

    def draw(p: TokenSamplingParams) -> list[int]:
        generator = p.make_generator()
        return [sample_next_token(logits, p, [], generator) for _ in range(30)]

    first = draw(params)
    assert first == draw(params)
    assert first != draw(TokenSamplingParams(temperature=1.0, top_p=0.9, top_k=100, seed=8))
    assert len(set(first)) > 1


def test_greedy_and_degenerate_filters_pick_the_argmax() -> None:
    logits = _logits()
    best = int(logits.argmax())
    assert sample_next_token(logits, TokenSamplingParams(), []) == best
    assert sample_next_token(logits, TokenSamplingParams(temperature=1.0, top_k=1, seed=0), []) == best
    assert sample_next_token(logits, TokenSamplingParams(temperature=1.0, top_p=1e-6, seed=0), []) == best


def test_top_k_and_top_p_restrict_the_support() -> None:
    logits = _logits()
    top5 = set(torch.topk(logits, 5).indices.tolist())
    params = TokenSamplingParams(temperature=2.0, top_k=5, seed=3)
    generator = params.make_generator()
    assert {sample_next_token(logits, params, [], generator) for _ in range(200)} <= top5
    probs = torch.softmax(logits, -1)
    order = torch.argsort(probs, descending=True)
    nucleus_size = int((probs[order].cumsum(0) < 0.5).sum()) + 1
    nucleus = set(order[:nucleus_size].tolist())
    params = TokenSamplingParams(temperature=1.0, top_p=0.5, seed=3)
    generator = params.make_generator()
    assert {sample_next_token(logits, params, [], generator) for _ in range(200)} <= nucleus


def test_penalties_push_repeated_tokens_down() -> None:
    logits = torch.tensor([2.0, 1.9, -1.0, 0.5])
    original = logits.clone()
    assert sample_next_token(logits, TokenSamplingParams(), [0]) == 0
    assert sample_next_token(logits, TokenSamplingParams(repetition_penalty=1.2), [0]) == 1
    assert sample_next_token(logits, TokenSamplingParams(presence_penalty=0.2), [0]) == 1
    assert sample_next_token(logits, TokenSamplingParams(frequency_penalty=0.06), [0]) == 0
    assert sample_next_token(logits, TokenSamplingParams(frequency_penalty=0.06), [0, 0]) == 1
    assert torch.equal(logits, original)  # the caller's logits are not modified


@pytest.mark.parametrize("temperature", [5e-324, 1e-300, 1e-40, 10.0])
@pytest.mark.parametrize("repetition_penalty", [5e-324, 1e-300, 1e-40, 10.0])
def test_extreme_valid_parameters_still_sample_a_token(temperature: float, repetition_penalty: float) -> None:
    """Every value SamplingParams accepts is usable: a tiny temperature (1e-300 was 0 in float32: 0/0) or a tiny
    repetition penalty (a logit divided past the float range: inf - inf) used to make NaN probabilities, which
    failed the request in the stage."""
    logits = _logits(vocab=4096).to(torch.bfloat16)
    generated = [int(i) for i in torch.topk(logits.float(), 20).indices] + [7, 7]
    for top_k, top_p in ((0, 1.0), (1, 1.0), (5, 0.5), (1_000_000, 5e-324)):
        params = TokenSamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                                     repetition_penalty=repetition_penalty, presence_penalty=-2.0,
                                     frequency_penalty=2.0, seed=1)
        token = sample_next_token(logits, params, generated, params.make_generator())
        assert 0 <= token < 4096
    if temperature < 1e-30 and repetition_penalty == 10.0:  # so small a temperature is greedy
        greedy = sample_next_token(logits, TokenSamplingParams(repetition_penalty=10.0), generated)
        assert sample_next_token(logits, TokenSamplingParams(temperature=temperature, repetition_penalty=10.0),
                                 generated) == greedy


def test_the_prompt_counts_for_the_repetition_penalty_only() -> None:
    logits = torch.tensor([2.0, 1.9, -1.0, 0.5])
    assert sample_next_token(logits, TokenSamplingParams(repetition_penalty=1.2), [], prompt_ids=[0]) == 1
    # presence and frequency count the generated tokens, not the prompt
    assert sample_next_token(logits, TokenSamplingParams(presence_penalty=1.0), [], prompt_ids=[0]) == 0
    assert sample_next_token(logits, TokenSamplingParams(frequency_penalty=1.0), [], prompt_ids=[0, 0]) == 0
    # a token in both is divided once, as transformers' RepetitionPenaltyLogitsProcessor does
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    scores = _logits(vocab=50)
    prompt, generated = [3, 4, 4, 9], [9, 9, 11]
    want = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompt + generated]), scores[None].clone())[0]
    params = TokenSamplingParams(repetition_penalty=1.3)
    for _ in range(5):  # the argmax after the penalty, then with it removed, and so on: the same order
        got = sample_next_token(scores, params, generated, prompt_ids=prompt)
        assert got == int(want.argmax())
        scores[got], want[got] = -1e9, -1e9


def test_suppressed_ids_are_never_drawn() -> None:
    logits = _logits(vocab=64)
    best = torch.topk(logits, 3).indices.tolist()
    assert sample_next_token(logits, TokenSamplingParams(), [], suppress=best[:2]) == best[2]
    params = TokenSamplingParams(temperature=1.0, top_k=1, seed=5)  # top-k counts what is left
    assert sample_next_token(logits, params, [], params.make_generator(), suppress=torch.tensor(best[:2])) == best[2]
    params = TokenSamplingParams(temperature=3.0, seed=5)
    generator = params.make_generator()
    drawn = {sample_next_token(logits, params, [], generator, suppress=best[:2]) for _ in range(300)}
    assert len(drawn) > 10 and not drawn & set(best[:2])


def test_from_params_fills_what_is_left_out_from_the_model_defaults() -> None:
    model = TokenSamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.05)
    assert TokenSamplingParams.from_params({}, model) == model
    assert TokenSamplingParams.from_params({"temperature": 0.0, "seed": None}, model) == \
        TokenSamplingParams(temperature=0.0, top_k=50, repetition_penalty=1.05)
    assert TokenSamplingParams.from_params({"top_p": 0.5, "max_tokens": 9, "stop": ["x"]}) == \
        TokenSamplingParams(top_p=0.5)
    with pytest.raises(ValueError, match="top_p"):
        TokenSamplingParams.from_params({"top_p": 0.0})


def test_a_salt_gives_another_stream_for_the_same_seed() -> None:
    params = TokenSamplingParams(temperature=1.0, seed=11)
    logits = _logits()

    def draw(salt: int) -> list[int]:
        generator = params.make_generator(salt)
        return [sample_next_token(logits, params, [], generator) for _ in range(20)]

    assert draw(0) == draw(0) and draw(1) == draw(1) and draw(0) != draw(1)
    assert TokenSamplingParams(seed=2**64 - 1).make_generator(1) is not None
    assert TokenSamplingParams().make_generator() is None


def test_presence_and_frequency_penalties_lower_the_generated_tokens() -> None:
    logits = torch.tensor([0.0, 3.0, 2.5, 2.0, 1.0])
    prompt = [0, 1]

    def pick(generated: list[int], **settings) -> int:
        return sample_next_token(logits, TokenSamplingParams(**settings), generated, prompt_ids=prompt)

    assert pick([1, 1, 2]) == 1
    # presence: token 1 and 2 each lose 0.8 -> 2.2, 1.7; token 3 (2.0) stays behind token 1
    assert pick([1, 1, 2], presence_penalty=0.8) == 1
    # frequency: token 1 (seen twice) loses 1.2, token 2 loses 0.6 -> 1.8, 1.9; token 3 wins
    assert pick([1, 1, 2], frequency_penalty=0.6) == 3
    # only the generated tokens count (the prompt's do not): nothing generated, nothing lowered
    assert pick([], frequency_penalty=2.0) == 1
    # a negative penalty raises them
    assert pick([3], presence_penalty=-1.5) == 3


def test_only_the_fields_a_caller_set_replace_a_models_decoding() -> None:
    from omnipipe.api.sampling_params import SamplingParams
    from omnipipe.stage.sampling import given_params

    model = TokenSamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.05)
    voice_only = SamplingParams(extra={"speaker": "chelsie"})
    assert voice_only.given == {"extra"} and given_params(voice_only.to_dict()) == {"extra": {"speaker": "chelsie"}}
    assert TokenSamplingParams.from_params(voice_only.to_dict(), model) == model
    greedy = SamplingParams(temperature=0.0, max_tokens=20)  # 0.0 is SamplingParams' default, and still given
    assert TokenSamplingParams.from_params(greedy.to_dict(), model) == \
        TokenSamplingParams(temperature=0.0, top_k=50, repetition_penalty=1.05)
    assert given_params(greedy.to_dict()) == {"temperature": 0.0, "max_tokens": 20}
    greedy.top_k = 3  # set later: given too
    assert greedy.given == {"temperature", "max_tokens", "top_k"}
    assert SamplingParams(0.5).given == {"temperature"} and SamplingParams.from_dict({"seed": 1}).given == {"seed"}
    assert TokenSamplingParams.from_params(SamplingParams().to_dict(), model) == model
    # a dict built by hand (no "given"): every field that is not None counts
    assert TokenSamplingParams.from_params({"top_k": 7, "seed": None}, model) == \
        TokenSamplingParams(temperature=0.9, top_k=7, repetition_penalty=1.05)
