"""Speech in: whisper tiny.en turns each request's audio into text for the thinker."""

from __future__ import annotations

from omnipipe.models.default.modeling.whisper import WhisperASR
from omnipipe.stage.request import StageRequest
from omnipipe.stage.runner import RunnerOutput, StageRunner


class WhisperEncoderRunner(StageRunner):
    def load(self) -> None:
        self.asr = WhisperASR(num_threads=self.context.threads)

    def warmup(self) -> None:
        import numpy as np

        self.asr.transcribe(np.zeros(16_000, np.float32), 16_000)

    def execute(self, batch: list[StageRequest], is_prefill: bool) -> list[RunnerOutput]:
        outputs = []
        for request in batch:
            item = request.take_input() or {}
            text = self.asr.transcribe(item["audio"], int(item["sample_rate_hz"])).strip()
            outputs.append(RunnerOutput(request.request_id, text_delta=text, num_units=1,
                                        data={"text": text, "instruction": item.get("instruction", ""),
                                              "history": item.get("history", [])}))
        return outputs
