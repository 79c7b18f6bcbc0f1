// What a live session page (voice, omni) hands to tests and curious developers as window.omnipipeVoice /
// window.omnipipeOmni: its state, what was said, every server event (audio payloads left out) and how each answer
// played.

const MAX_EVENTS = 2000;

/** Fresh hooks for a page. */
export function newHooks() {
  return {
    state: "idle",
    transcript: [], // [{role: "user"|"assistant", text, status}]
    audioChunksReceived: 0,
    events: [], // [{type, t_ms, ...}] without audio payloads
    sessionId: null,
    worker: null,
    errors: [],
    interruptions: [], // barge-ins: [{response_id, playing, t_ms}]
    // per answer, its playback: [{response_id, first_chunk_ms, first_audio_ms (playback starts), buffer_ms (the
    // jitter buffer chosen), arrival_rate (seconds of audio per second), audio_s, underruns, underrun_ms,
    // max_stall_ms (the longest wait for a chunk beyond the audio the previous one carried),
    // speech_end_to_first_audio_ms (from the end of the speech it answers to its first audio's arrival)}]; times
    // since the session started, like the events'
    answers: [],
    jitterBuffer: true, // false: each answer's audio plays as it arrives (set before the answer starts)
    turnDetection: null, // the session's turn_detection as the last session.updated showed it
    duplex: false, // the server's model is full duplex (no turns: duplex-page.js)
  };
}

/** Add a server event to `hooks.events` (the last MAX_EVENTS kept), an audio delta as its size only. */
export function logEvent(hooks, event, tMs) {
  const entry = event.type === "response.output_audio.delta"
    ? { type: event.type, t_ms: tMs, response_id: event.response_id,
      bytes: Math.floor(((event.delta || "").length * 3) / 4) }
    : { ...event, t_ms: tMs };
  hooks.events.push(entry);
  if (hooks.events.length > MAX_EVENTS) hooks.events.splice(0, hooks.events.length - MAX_EVENTS);
}

/** Copy the player's figures of an answer (`stats`, see pcm-player.js) into its hooks.answers entry; times are
 * counted from `startedAt` (the session's start, on performance.now()'s clock). */
export function copyAnswerFigures(stats, figures, startedAt) {
  const since = (at) => (at === null ? null : Math.round(at - startedAt));
  Object.assign(figures, {
    first_chunk_ms: since(stats.firstChunkAt),
    first_audio_ms: since(stats.firstAudioAt),
    buffer_ms: stats.bufferMs,
    arrival_rate: stats.arrivalRate === null ? null : Math.round(stats.arrivalRate * 1000) / 1000,
    audio_s: Math.round(stats.audioSeconds * 1000) / 1000,
    underruns: stats.underruns,
    underrun_ms: Math.round(stats.underrunMs),
    max_stall_ms: Math.round(stats.maxStallMs),
  });
}
