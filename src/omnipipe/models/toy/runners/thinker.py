"""Toy thinker: a one-head attention model with a real per-request KV cache that copies its prompt upper-cased.

Prompt character ``p`` is cached with key one-hot(p) and value one-hot(token); decode step ``t`` queries
one-hot(t), so attention picks prompt character ``t``; an output matrix maps it to upper case. Generated tokens
are appended to the cache under a key no query matches. The prompt ends with EOS, so the copy ends with it.

The per-request state is a dict whose entries each step replaces (never mutates in place), so a shallow copy
taken before a step restores it after a failed batched step (``snapshot``/``restore``).

Fault injection, for tests only (stage option ``fault_injection: true``; otherwise ignored): ``extra["fail"]``
(``ToyThinkerParams``) in a request's thinker params makes ``execute`` raise a RuntimeError when it reaches that
request, after its batch-mates before it have been advanced: ``True`` at its first step (the prefill call), an
integer ``n >= 1`` at decode step ``n`` (after ``n`` tokens). It raises alone too, so that request fails and its
batch-mates must come out as if it had never been there.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from omnipipe.models.toy.processors import ToyThinkerParams
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner

VOCAB = 257  # bytes + EOS
EOS = 256
MAX_POSITIONS = 1024
SHARPNESS = 40.0


def encode_text(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="replace")[: MAX_POSITIONS - 2])


class ToyThinkerModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.values = torch.nn.Embedding(VOCAB, VOCAB)
        self.out = torch.nn.Linear(VOCAB, VOCAB, bias=False)
        with torch.no_grad():
            self.values.weight.copy_(torch.eye(VOCAB))
            upper = torch.eye(VOCAB)
            for c in range(ord("a"), ord("z") + 1):
                upper[c, c] = 0
                upper[c, c - 32] = 1
            self.out.weight.copy_(upper.T)

    def keys(self, positions: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(positions, MAX_POSITIONS).float() * SHARPNESS

    def prefill(self, token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.tensor(token_ids)
        return self.keys(torch.arange(len(token_ids))), self.values(ids)

    def decode(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        """k [B, L, P], v [B, L, V], mask [B, L] (True = real), steps [B] -> logits [B, V]."""
        q = torch.nn.functional.one_hot(steps, MAX_POSITIONS).float()
        scores = torch.einsum("bp,blp->bl", q, k).masked_fill(~mask, float("-inf"))
        attended = torch.einsum("bl,blv->bv", scores.softmax(-1), v)
        return self.out(attended)


class ToyThinkerRunner(StageRunner):
    def load(self) -> None:
        time.sleep(float(self.context.options.get("load_delay_ms", 0)) / 1000)  # stands in for a slow model load
        self.model = ToyThinkerModel().eval()
        self.step_delay_s = float(self.context.options.get("step_delay_ms", 0)) / 1000
        self.prefill_delay_s = float(self.context.options.get("prefill_delay_ms", 0)) / 1000
        self.fault_injection = bool(self.context.options.get("fault_injection", False))

    def snapshot(self, request: StageRequest) -> Any:
        return None if request.runner_state is None else dict(request.runner_state)

    def restore(self, request: StageRequest, snapshot: Any) -> None:
        request.runner_state = snapshot

    @torch.inference_mode()
    def execute(self, batch: list[StageRequest]) -> list[RunnerOutput]:
        newcomers = [request for request in batch if not request.prefilled]  # prefilled, then decoded with the rest
        for request in newcomers:
            text = "".join(item.get("text", "") for item in request.take_all_inputs())
            ids = encode_text(text) + [EOS]
            request.num_prompt_tokens = len(ids)
            k, v = self.model.prefill(ids)
            request.runner_state = {"k": k, "v": v, "step": 0}
            request.prefilled = True
        if newcomers and self.prefill_delay_s:
            time.sleep(self.prefill_delay_s)
        states = [r.runner_state for r in batch]
        length = max(s["k"].shape[0] for s in states)
        k = torch.zeros(len(batch), length, MAX_POSITIONS)
        v = torch.zeros(len(batch), length, VOCAB)
        mask = torch.zeros(len(batch), length, dtype=torch.bool)
        for i, s in enumerate(states):
            n = s["k"].shape[0]
            k[i, :n], v[i, :n], mask[i, :n] = s["k"], s["v"], True
        logits = self.model.decode(k, v, mask, torch.tensor([s["step"] for s in states]))
        tokens = logits.argmax(-1).tolist()
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        outputs = []
        for request, state, token in zip(batch, states, tokens, strict=True):
            fail = ToyThinkerParams(**request.params.get("extra", {})).fail if self.fault_injection else False
            if fail is True or (type(fail) is int and fail == state["step"]):
                raise RuntimeError(f"injected fault in {request.request_id} at step {state['step']}")
            state["step"] += 1
            max_tokens = int(request.params.get("max_tokens", 1 << 30))
            if token == EOS:
                outputs.append(RunnerOutput.decoded(request.request_id, "stop"))
                continue
            # append the generated token to the cache under the never-queried last position
            state["k"] = torch.cat([state["k"], self.model.keys(torch.tensor([MAX_POSITIONS - 1]))])
            state["v"] = torch.cat([state["v"], self.model.values(torch.tensor([token]))])
            char = bytes([token]).decode("latin-1")
            done = state["step"] >= max_tokens
            outputs.append(RunnerOutput.decoded(request.request_id, "length" if done else None, text_delta=char,
                                                data={"text": char}, num_units=1))
        return outputs
