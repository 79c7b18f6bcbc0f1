"""``WS /v1/realtime``: OpenAI's Realtime API (GA, or beta on request) over one WebSocket, one response at a time;
docs/openai-compatibility.md has the protocol. One module per concept, each importing only those after it: route,
session, duplex, transcription_session, turn, speculative_start, response, live_transcript, audio_buffer,
transcription, conversation, frames, idle, pause; then checks and events. None holds the session (``session.py``)."""

from omnipipe.server.routes.realtime.route import router

__all__ = ["router"]
