"""Speech in: whisper tiny.en turns each request's audio into text, one segment per step.

The first step starts a request's decoding and reports the clip's language and duration; each later step decodes
its next segment (a new 30 s window when the current one is used up), so the transcript streams as it is decoded
and an aborted request stops between segments. The step after the last segment finishes the request. A request
with ``fitted_window`` (a realtime session's turn, a short clip) is decoded and finished in its first step, as one
segment.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from omnipipe.models.default.modeling.whisper import DecodeOptions, Decoding, TranscriptSegment, WhisperASR
from omnipipe.models.default.processors import TranscriptionParams
from omnipipe.stage.request import RequestStatus, StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner


def segment_details(segment: TranscriptSegment) -> dict[str, Any]:
    details = {k: v for k, v in asdict(segment).items() if k != "words"}
    details["start"], details["end"] = details.pop("start_s"), details.pop("end_s")
    if segment.words is not None:
        details["words"] = [{"word": w.word, "start": w.start_s, "end": w.end_s} for w in segment.words]
    return {"segment": details}


class WhisperEncoderRunner(StageRunner):
    """An ``ar`` stage: a request's runner state is its :class:`Decoding` (not restorable after a failed step)."""

    def load(self) -> None:
        self.asr = WhisperASR(num_threads=self.context.threads, device=self.context.device)

    def warmup(self) -> None:
        import numpy as np

        self.asr.transcribe(np.zeros(16_000, np.float32), 16_000)

    def execute(self, batch: list[StageRequest]) -> list[RunnerOutput]:
        return [self._step(request) if request.prefilled else self._start(request) for request in batch]

    def _start(self, request: StageRequest) -> RunnerOutput:
        item = next(iter(request.take_all_inputs()), {})
        params = TranscriptionParams(**(request.params.get("extra") or {}))  # checked on arrival
        request.prefilled = True
        if params.fitted_window:
            return self._fitted(request, item, params)
        options = DecodeOptions(word_timestamps=params.word_timestamps, initial_prompt=params.prompt,
                                temperature=float(params.temperature))
        decoding = self.asr.start(item["audio"], int(item["sample_rate_hz"]), options)
        request.runner_state = {"decoding": decoding, "instruction": item.get("instruction", ""),
                                "history": item.get("history", []), "tools": item.get("tools", [])}
        return RunnerOutput(request.request_id, details={"language": decoding.language,
                                                         "duration": round(decoding.duration_s, 3)})

    def _fitted(self, request: StageRequest, item: dict[str, Any], params: TranscriptionParams) -> RunnerOutput:
        """A fitted-window decode, whole in this one step (a session's turn waits for nothing else)."""
        try:
            decoding = self.asr.start_fitted(item["audio"], int(item["sample_rate_hz"]), params.prefix,
                                             float(params.temperature))
        except ValueError as exc:
            return RunnerOutput.failed(request.request_id, str(exc), error_field="prompt.multi_modal_data.audio")
        segment = decoding.next_segment()
        text = segment.text.strip() if segment is not None else ""
        details = {"language": decoding.language, "duration": round(decoding.duration_s, 3),
                   **(segment_details(segment) if segment is not None else {})}
        return RunnerOutput(request.request_id, text_delta=text, num_units=len(segment.tokens) if segment else 0,
                            details=details, status=RequestStatus.FINISHED,
                            data={"text": text, "instruction": item.get("instruction", ""),
                                  "history": item.get("history", []), "tools": item.get("tools", [])})

    def _step(self, request: StageRequest) -> RunnerOutput:
        state = request.runner_state
        decoding: Decoding = state["decoding"]
        segment = decoding.next_segment()
        if segment is None:
            return RunnerOutput(request.request_id, status=RequestStatus.FINISHED,
                                data={"text": "", "instruction": state["instruction"],
                                      # the instruction and conversation alone
                                      "history": state["history"], "tools": state["tools"]})
        # the first segment's text starts without a space, every later one with one (their join is the transcript)
        text = segment.text.strip()
        if text and state.setdefault("said", False):
            text = " " + text
        state["said"] = state["said"] or bool(text)
        return RunnerOutput(request.request_id, text_delta=text, num_units=len(segment.tokens),
                            details=segment_details(segment),
                            data={"text": text.strip(), "instruction": state["instruction"],
                                  "history": state["history"], "tools": state["tools"]})
