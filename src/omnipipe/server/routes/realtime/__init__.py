"""``WS /v1/realtime``: OpenAI's Realtime API (GA, or beta for a client that asks for it) over one WebSocket, one
response at a time. The protocol, event by event, is in docs/openai-compatibility.md; one module per concept here
(route, session, audio_buffer, conversation, transcription, response, pause, idle; events and checks they share)."""

from omnipipe.server.routes.realtime.route import router

__all__ = ["router"]
