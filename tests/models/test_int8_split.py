"""``int8-split``: the same int8 weights as ``int8``, each activation row written as two int8 rows (coarse and
remainder), so a row with a large entry keeps its ordinary entries: its result is nearer float's than int8's, and
each row's result depends on that row only."""

from __future__ import annotations

import torch

from omnipipe.models.default.modeling.quantized import Int8Linear, Int8SplitLinear, check_weight_format


def test_split_activations_come_nearer_float_and_rows_stay_their_own() -> None:
    torch.manual_seed(0)
    weight = torch.randn(64, 256)
    x = torch.randn(6, 256)
    x[:, 3] = 60.0  # a massive entry: 7-bit activations keep few levels for the others
    want = x @ weight.T
    split, plain = Int8SplitLinear(weight)(x), Int8Linear(weight)(x)
    assert float((split - want).abs().max()) < 0.5 * float((plain - want).abs().max())
    assert torch.equal(Int8SplitLinear(weight)(x[2:3]), split[2:3])  # alone or beside others
    assert check_weight_format("int8-split") == "int8-split"
