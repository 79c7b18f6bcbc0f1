"""The Qwen2.5-Omni talker's cap has the name every decoder stage gives it (``max_new_tokens``); its older name
``max_codes`` still sets it, and giving both is refused naming the field."""

from __future__ import annotations

import pytest

from omnipipe.models.qwen2_5_omni.options import TalkerOptions
from omnipipe.util.field_error import FieldError


def test_max_codes_is_max_new_tokens_older_name() -> None:
    assert TalkerOptions(model="m").max_new_tokens == 2048
    assert TalkerOptions(model="m", max_new_tokens=300).max_new_tokens == 300
    assert TalkerOptions(model="m", max_codes=120).max_new_tokens == 120
    with pytest.raises(FieldError) as both:
        TalkerOptions(model="m", max_new_tokens=300, max_codes=120)
    assert both.value.field == "max_codes"
    with pytest.raises(FieldError) as bad:
        TalkerOptions(model="m", max_codes=0)
    assert bad.value.field == "max_codes"
