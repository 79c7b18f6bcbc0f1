"""Names in src/omnipipe that are used where vulture cannot see it (read by the dead-code check, never imported).

``python -m vulture`` (configured in pyproject.toml's ``[tool.vulture]``) reports a name as unused when nothing in
its paths reads it. Each group below names what is read by a library, by name from a string, over the wire or only
by the tests, and says why. Vulture matches by name: a module-level name through its import, an attribute or a
field as ``_.name``. Something that is really unused is deleted, not listed here.
"""

from types import SimpleNamespace

import omnipipe
from omnipipe.api.outputs import OmniRequestOutput
from omnipipe.gateway.recording.taps.transcription import TranscriptionTap
from omnipipe.models.default import pipeline as default_pipeline
from omnipipe.models.default import processors as default_processors
from omnipipe.models.default.modeling.decoder import CachedDecoder
from omnipipe.models.default.modeling.piper_decoder import DecoderStream, PiperDecoder, iter_windows
from omnipipe.models.default.modeling.piper_talker import PiperTalker
from omnipipe.models.default.prompting import build_prompt
from omnipipe.models.default.runners.encoder import WhisperEncoderRunner
from omnipipe.models.default.weights import prepare as default_prepare
from omnipipe.models.default.weights.voice import list_voices
from omnipipe.models.image import pipeline as image_pipeline
from omnipipe.models.image import processors as image_processors
from omnipipe.models.image.runners.diffusion import DiffusersRunner
from omnipipe.models.image.weights import prepare as image_prepare
from omnipipe.models.qwen2_5_omni import processors as qwen2_5_processors
from omnipipe.models.qwen2_5_omni.modeling.token2wav_stream import token2wav_seam_rows
from omnipipe.models.qwen2_5_omni.reference_voice import reference_from_clip
from omnipipe.models.qwen2_5_omni.runners import talker as qwen2_5_talker
from omnipipe.models.qwen2_5_omni.runners import thinker as qwen2_5_thinker
from omnipipe.models.qwen2_5_omni.runners.token2wav import Qwen25Token2WavRunner
from omnipipe.models.qwen2_5_omni.weights import load as qwen2_5_load
from omnipipe.models.qwen2_5_omni.weights import tiny as qwen2_5_tiny
from omnipipe.models.qwen3_omni import processors as qwen3_processors
from omnipipe.models.qwen3_omni.modeling import code2wav_stream as qwen3_code2wav_stream
from omnipipe.models.qwen3_omni.runners import talker as qwen3_talker
from omnipipe.models.qwen3_omni.runners import thinker as qwen3_thinker
from omnipipe.models.qwen3_omni.runners.code2wav import Qwen3Code2WavRunner
from omnipipe.models.qwen3_omni.weights import load as qwen3_load
from omnipipe.models.qwen3_omni.weights import tiny as qwen3_tiny
from omnipipe.models.toy import pipeline as toy_pipeline
from omnipipe.models.toy import processors as toy_processors
from omnipipe.models.toy.runners.talker import ToyTalkerRunner
from omnipipe.models.toy.runners.thinker import ToyThinkerRunner
from omnipipe.models.toy.runners.vocoder import ToyVocoderRunner
from omnipipe.models.voxtral import pipeline as voxtral_pipeline
from omnipipe.models.voxtral import processors as voxtral_processors
from omnipipe.models.voxtral.runners.thinker import VoxtralThinkerRunner
from omnipipe.protocol.realtime import CLIENT_EVENT_MODELS
from omnipipe.stage.paged_attention import register_kernel
from omnipipe.stage.runner_driver import ForwardCounter
from omnipipe.stage.streaming_audio import merge_audio_embeds
from omnipipe.transport.relay.recv_buffers import RecvBufferPool

_ = SimpleNamespace()

# Pipelines and what their specs name by a dotted path string ("module:NAME" or "module.NAME"), imported when a
# pipeline is built: the pipelines in models/registry.py, and each spec's stage runners, prompt processors, edge
# processors, weight preparation and status, voice lists (models/*/pipeline.py) and tiny checkpoint writers
# (models/registry.py).
_PIPELINES = (default_pipeline.DEFAULT, default_pipeline.TTS, default_pipeline.ASR, image_pipeline.IMAGE,
              image_pipeline.THINK_AND_DRAW, toy_pipeline.TTS_PIPELINE, voxtral_pipeline.TRANSCRIBE_PIPELINE)
_STAGE_RUNNERS = (WhisperEncoderRunner, DiffusersRunner, qwen2_5_thinker.Qwen25ThinkerRunner,
                  qwen2_5_talker.Qwen25TalkerRunner, Qwen25Token2WavRunner, qwen3_thinker.Qwen3ThinkerRunner,
                  qwen3_talker.Qwen3TalkerRunner, Qwen3Code2WavRunner, ToyThinkerRunner, ToyTalkerRunner,
                  ToyVocoderRunner, VoxtralThinkerRunner)
_PROCESSORS = (default_processors.default_prompt, default_processors.tts_prompt, default_processors.asr_prompt,
               default_processors.encoder2thinker, default_processors.thinker2talker, image_processors.image_prompt,
               image_processors.think_and_draw_prompt, image_processors.thinker2diffusion,
               qwen2_5_processors.omni_prompt, qwen2_5_processors.thinker2talker,
               qwen2_5_processors.talker2token2wav, qwen2_5_processors.talker2token2wav_async_chunk,
               qwen3_processors.thinker2talker, toy_processors.text_prompt, toy_processors.tts_prompt,
               toy_processors.thinker2talker, voxtral_processors.transcription_prompt)
_WEIGHTS = (default_prepare.prepare_all, default_prepare.speech_status, image_prepare.prepare_image,
            image_prepare.image_status, image_prepare.prepare_think_and_draw, image_prepare.think_and_draw_status,
            list_voices, qwen2_5_load.list_speakers, qwen3_load.list_speakers, qwen2_5_tiny.write_tiny_checkpoint,
            qwen3_tiny.write_tiny_checkpoint, reference_from_clip)

# The package's lazy exports (PEP 562): Python calls a module's __getattr__ and __dir__ itself.
_LAZY_EXPORTS = (omnipipe.__getattr__, omnipipe.__dir__)

# The Python API a user of omnipipe calls (api/ is what a Python user imports; nothing inside omnipipe needs it).
_PUBLIC_API = (OmniRequestOutput.pil_image,)

# Pydantic: model_config is the model's configuration, read by pydantic. Fields of the OpenAI-compatible bodies
# (protocol/openai.py, protocol/responses.py) and the realtime events (protocol/realtime.py) that are only parsed
# from JSON (accepted so a client that sends them gets no 400) or only written to it (set by keyword, serialised by
# name).
_PYDANTIC = (_.model_config,
             # protocol/openai.py
             _.audio_url, _.video_url, _.refusal, _.annotations, _.tool_calls, _.service_tier, _.prompt_cache_key,
             _.safety_identifier, _.parallel_tool_calls, _.completion_tokens, _.total_tokens, _.expires_at,
             _.moderation, _.b64_json, _.revised_prompt, _.owned_by, _.logprob, _.cached_tokens,
             _.prompt_tokens_details,
             # protocol/responses.py
             _.strict, _.verbosity, _.include_obfuscation, _.reasoning, _.input_tokens_details,
             _.output_tokens_details, _.incomplete_details,
             # protocol/realtime.py
             _.create_response, _.interrupt_response, _.idle_timeout_ms, _.speculative_start, _.noise_reduction,
             _.tracing, _.include, _.input_audio_format, _.output_audio_format, _.event_id, _.workflow_name,
             _.group_id, _.post_instructions, _.retention_ratio, _.token_limits)

# Deployment knobs (config/deploy_config.py RelayDeploy): set from YAML by field name, and read by name as
# "<group>_<option>" when RelayDeploy.backend_options groups them per relay backend.
_DEPLOY_KNOBS = (_.shm_slot_bytes, _.shm_num_slots, _.mooncake_slot_bytes, _.mooncake_num_slots,
                 _.mooncake_protocol, _.torch_dist_host, _.torch_dist_timeout_s, _.torch_dist_max_pending)

# Attributes set on a library's objects for the library to read.
_LIBRARY_SETTINGS = (
    # llama.cpp's context params and batch (bench/thinker.py)
    _.n_ctx, _.n_batch, _.n_ubatch, _.n_seq_max, _.kv_unified, _.n_threads, _.n_threads_batch, _.n_tokens,
    # uvicorn: Server.should_exit stops the server (cli/serve.py)
    _.should_exit,
    # onnxruntime SessionOptions (models/default/weights/voice.py, server/vad.py) and an ONNX graph's symbolic
    # dimension (voice.py)
    _.intra_op_num_threads, _.inter_op_num_threads, _.execution_mode, _.graph_optimization_level,
    _.log_severity_level, _.dim_param,
    # PyAV: decode a video stream on several threads (util/media.py)
    _.thread_type,
    # pyzmq CURVE socket options (transport/control_plane.py)
    _.curve_secretkey, _.curve_publickey, _.curve_server, _.curve_serverkey,
    # torch.distributed process group options (transport/relay/torch_dist_groups.py)
    _._devices, _._timeout,
    # tokenizers: the BPE tokenizer's pre-tokenizer (models/*/weights/tiny.py)
    _.pre_tokenizer,
    # transformers: a processor's video processor, read by ProcessorMixin (models/qwen2_5_omni/modeling/processor.py)
    _.video_processor,
    # transformers: what a decoder reads of the cache it is given (stage/kv_cache.py's PagedKVCache)
    _.get_seq_length, _.is_compileable,
    # torch.backends.cudnn's TF32 switch, set for a CUDA stage (stage/device.py)
    _.allow_tf32,
)

# transformers classes imported for the type checker only and named in cast() strings (models/qwen*/)
_CAST_TYPES = (_.PreTrainedConfig, _.Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration)

# Parameters a caller's protocol fixes: the async context manager's __aexit__ (gateway/proxy/queue_wait.py),
# pyzmq's ZAP credentials callback(domain, key) (transport/control_plane.py) and transformers' attention function.
_PROTOCOL_PARAMETERS = (_.exc_type, _.tb, _.domain,
                        _.dropout)  # transformers' attention function signature (stage/paged_attention.py)

# Read only by the tests: views into a component's state that tests assert on, the streaming pieces tests compare
# with the whole (decode, prompt), and entry points tests drive directly.
_TESTED_ONLY = (CLIENT_EVENT_MODELS, build_prompt, CachedDecoder.num_cached_tokens, CachedDecoder.kv_cache_bytes,
                PiperDecoder.decode_window, iter_windows, DecoderStream, DecoderStream.next_window,
                PiperTalker.phonemize_sentences, token2wav_seam_rows, qwen3_code2wav_stream.decode_window,
                _.transformer_context_frames, _.last_report,  # Code2WavGeometry's field, PeriodicCleanup's
                TranscriptionTap.on_response_text, RecvBufferPool.pooled_bytes, _.free_blocks,
                ForwardCounter,  # the batched runners' tests count forwards with it
                register_kernel, _.block_tables,  # what a paged attention kernel plugs in by and reads
                _._attn_implementation,  # read by transformers: bench gpu-check's decoder attends with sdpa
                merge_audio_embeds)  # a streamed clip's audio into a thinker prompt (no runner feeds streams yet)

# The Mimi codec (models/mimi/): its decoder stage, named by dotted path in the CSM and Moshi pipelines; a MimiConfig's
# halves dropped by assigning None (transformers' property setters); the encode stream's frame count (tests read it)
from omnipipe.models.mimi.runners.decoder import MimiDecoderRunner  # noqa: E402

_MIMI = (MimiDecoderRunner, _.encoder_config, _.decoder_config, _.frames_encoded)

# Voxtral's transcription knobs (a request's language), named by dotted path in its voxtral_transcribe pipeline's stage
from omnipipe.models.voxtral.options import VoxtralTranscriptionParams  # noqa: E402

_VOXTRAL = (VoxtralTranscriptionParams,)

# Moshi (models/moshi/): its duplex stage, named by dotted path in the moshi pipeline; its depth decoder's class,
# imported for the type checker only and named in a cast() string
from omnipipe.models.moshi.runners.duplex import MoshiDuplexRunner  # noqa: E402

_MOSHI = (MoshiDuplexRunner, _.MoshiDepthDecoder)

# CSM (models/csm/): its backbone stage and reference-voice hook, named by dotted path in its pipeline; transformers'
# depth decoder class named in a cast() string; the tiny tokenizer's post_processor (set on a tokenizers Tokenizer)
from omnipipe.models.csm.reference_voice import reference_codes  # noqa: E402
from omnipipe.models.csm.runners.backbone import CsmBackboneRunner  # noqa: E402

_CSM = (CsmBackboneRunner, reference_codes, _.CsmDepthDecoderForCausalLM, _.post_processor)

# the Voxtral Realtime stage runner, named by its pipeline's StageSpec string
from omnipipe.models.voxtral_realtime.runners.transcriber import VoxtralRealtimeRunner  # noqa: E402

_VOXTRAL_REALTIME = (VoxtralRealtimeRunner,)
