"""``FieldError``: bad input, with the field it came in and the rule it broke, carried to the API boundary.

Every layer that validates what a caller sent (prompt checks, sampling parameters, edge options, the plan of
output modalities) raises it; the boundary (HTTP, WebSocket, CLI, Python API) renames ``field`` to its own
vocabulary and answers. No layer parses a message to find the field.
"""

from __future__ import annotations


class FieldError(ValueError):
    """``field``: the dotted path of the bad value (``sampling_params.top_p``); ``rule``: what it must be."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule

    def renamed(self, field: str) -> FieldError:
        """The same rule under another name (``sampling_params.seed`` -> ``omnipipe.sampling_params.talker.seed``)."""
        return FieldError(field, self.rule)
