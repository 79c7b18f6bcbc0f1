"""The Qwen2.5-Omni pipeline: thinker (AR: text, and hidden states for the talker) -> talker (AR: codec codes) ->
token2wav (generation: DiT + BigVGAN, 24 kHz). The checkpoint is the stage option ``model`` of every stage (a
directory, e.g. one ``omnipipe tiny-checkpoint qwen2_5_omni DIR`` wrote)."""

from omnipipe.config.pipeline_spec import EdgeSpec, PipelineSpec, ServingTraits, StageSpec
from omnipipe.models.qwen2_5_omni.runners.token2wav import SAMPLE_RATE_HZ

_P = "omnipipe.models.qwen2_5_omni"
CODE_RATE_HZ = 50.0  # codec codes per second of audio: 2 mel frames of 240 samples at 24 kHz

PIPELINE = PipelineSpec(
    name="qwen2_5_omni",
    description="Qwen2.5-Omni stage by stage: thinker -> talker -> token2wav (DiT + BigVGAN); text, image, audio "
                "and video in, text and speech out",
    stages=(
        StageSpec("thinker", "ar", f"{_P}.runners.thinker:Qwen25ThinkerRunner", final_output="text"),
        StageSpec("talker", "ar", f"{_P}.runners.talker:Qwen25TalkerRunner",
                  extra_params=f"{_P}.processors:Qwen25TalkerParams"),
        StageSpec("token2wav", "generation", f"{_P}.runners.token2wav:Qwen25Token2WavRunner",
                  final_output="audio", sample_rate_hz=SAMPLE_RATE_HZ,
                  extra_params=f"{_P}.processors:Qwen25Token2WavParams"),
    ),
    edges=(
        EdgeSpec("thinker", "talker", f"{_P}.handoff.thinker2talker", f"{_P}.handoff.thinker2talker_async_chunk"),
        EdgeSpec("talker", "token2wav", f"{_P}.processors.talker2token2wav",
                 f"{_P}.processors.talker2token2wav_async_chunk",
                 options="omnipipe.chunk.accumulation:FrameChunkOptions"),
    ),
    prompt_processor=f"{_P}.processors.omni_prompt",
    input_modalities=("text", "image", "audio", "video"),
    comprehension_stage="thinker",
    model_stages=("thinker", "talker", "token2wav"),
    # the server's voices: the checkpoint's (spk_dict.pt), each request's going to the talker; a voice made from a
    # clip is a checkpoint voice with the clip's mel as the token2wav's reference (reference_voice.py)
    serving=ServingTraits(voices=f"{_P}.weights.load:list_speakers", voice_param=("talker", "speaker"),
                          video_stage="thinker", reference_voice=f"{_P}.reference_voice:reference_from_clip",
                          reference_param=("token2wav", "reference_mel")),
    weights_status=f"{_P}.weights.load:weights_status",
    takes_history=True,
    constrained_decoding=True,
    # windows start on the DiT's 24-mel-frame blocks (12 codes); 24 left and 12 right context codes keep a chunked
    # stream within 6e-7 of absmax of the whole decode on the tiny checkpoint (token2wav_seam_rows, 96 codes)
    default_deploy={
        "edges": {"talker->token2wav": {"options": {
            "codec_chunk_frames": 24, "initial_codec_chunk_frames": 12, "left_context_frames": 24,
            "right_context_frames": 12, "frame_rate_hz": CODE_RATE_HZ}}},
        "stages": {name: {"threads": 1, "max_num_seqs": 4} for name in ("thinker", "talker", "token2wav")},
    },
)
