"""``WS /v1/realtime``: OpenAI's Realtime API (GA, or beta for a client that asks for it) over one WebSocket, one
response at a time. The protocol, event by event, is in docs/openai-compatibility.md. One module per concept, each
importing only those after it: route, session, turn, speculative_start, response, live_transcript, audio_buffer,
transcription, conversation, frames, idle, pause; then checks and events, which they share. A turn's life is
``turn.py``'s state machine; the parts it drives decide nothing of it, and none holds the session (``session.py``)."""

from omnipipe.server.routes.realtime.route import router

__all__ = ["router"]
