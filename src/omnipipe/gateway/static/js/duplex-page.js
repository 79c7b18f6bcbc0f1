// A live spoken session over the realtime WebSocket (WS /v1/realtime): the voice page, and the omni page, which
// adds the camera through the extension points of startDuplexPage (see its comment).
//
// Start -> the gateway queues us ("queued" / "queue_update") -> "queue_done" -> the worker's "session.created";
// then the page turns server VAD on, opens the microphone and appends 40 ms of 24 kHz pcm16 at a time (as
// `omnipipe bench voice` does: a shorter chunk would reach the VAD sooner, a longer one later). The server decides
// when a question ends, answers with "response.output_audio.delta" (played at once) and
// "response.output_audio_transcript.delta" (shown), and reports "input_audio_buffer.speech_started" when we talk again:
// that is a barge-in, so playback stops immediately. Pause/Resume send "session.pause" / "session.resume".
// Each answer shows how long after the end of speech its first audio came, and the session's median beside the
// controls (voice-answer-delay.js says how that is measured). The preset chosen (presets.js) goes into the first
// session.update: its instructions, voice and output modalities. When the turn ends is the page's own choice
// (turn-detection.js): server VAD in that first update, semantic VAD in one of its own after it, so a server that
// cannot offer it refuses only that (the session then goes on answering at pauses, and says so).
// A full-duplex model (Moshi) has no turns: its server says so by creating the session with no turn detection
// (audio.input.turn_detection null, where every other server starts with server VAD). The page then sends no
// session.update, only the microphone's audio, and plays the one long answer that streams back while the user
// talks; the turn choice and Pause are disabled (the server refuses both for such a model).

import { bytesToBase64, base64ToBytes } from "./base64.js";
import { $, formatSeconds, h } from "./dom.js";
import { ApiError, describeError } from "./api.js";
import { MicCapture } from "./mic.js";
import { PcmPlayer } from "./pcm-player.js";
import { floatToPcm16 } from "./wav.js";
import { QueueCountdown } from "./queue.js";
import { copyAnswerFigures, logEvent, newHooks } from "./duplex-hooks.js";
import { AnswerDelayClock, delayNote, showDelaySummary } from "./voice-answer-delay.js";
import { VoiceTranscript } from "./voice-transcript.js";
import { mountPresetSelector, realtimeSession } from "./presets.js";
import { mountTurnDetection } from "./turn-detection.js";

const RATE = 24000;
const CHUNK_MS = 40;

let els = null;
let hooks = null;
let transcript = null;
let extension = {}; // what the page adds: see startDuplexPage
let presets = null; // the preset selector (presets.js)
let turns = null; // when the turn ends (turn-detection.js)

function findElements() {
  return {
    orb: $("#orb"), label: $("#state-label"), detail: $("#state-detail"), meter: $("#meter"),
    start: $("#start"), pause: $("#pause"), stop: $("#stop"),
    sessionLink: $("#session-link"), error: $("#error"), transcript: $("#transcript"),
    delays: { summary: $("#delay-summary"), median: $("#delay-median"), count: $("#delay-count") },
  };
}

const LABELS = {
  idle: ["Ready", "Press Start, then just talk."],
  microphone: ["Microphone…", "Allow the microphone to start the session."],
  connecting: ["Connecting…", "Opening the session."],
  queued: ["In the queue", ""],
  listening: ["Listening", "Ask your question; the model answers when you pause."],
  hearing: ["Listening", "Hearing you…"],
  thinking: ["Thinking…", "Working on the answer."],
  buffering: ["Buffering…", "The answer is arriving; it plays once enough of it is here to play smoothly."],
  speaking: ["Speaking", "Talk to interrupt."],
  paused: ["Paused", "The model is not listening. Resume to go on."],
  duplex: ["Talking", "The model listens and speaks at the same time: talk whenever you like."],
  closed: ["Session ended", "Press Start for a new session."],
  error: ["Stopped", "See the message on the right."],
};

let labels = LABELS;
let session = null; // the running session, or null
const player = new PcmPlayer({ sampleRate: RATE, onStateChange: () => render() });

function newSession() {
  return {
    ws: null,
    mic: null,
    phase: "microphone", // microphone | connecting | queued | live | closed | error
    preroll: [], // the last moment of audio before the session was live, sent once it is
    queuePlace: "", // the place in the queue, and the wait counted down beside it
    queueWait: "",
    countdown: null,
    paused: false,
    duplex: false, // a full-duplex model: no turns (see the top of this file)
    sending: false,
    userSpeaking: false,
    awaitingResponse: false,
    responseId: null,
    interrupted: new Set(),
    spokenItems: new Map(),  // committed audio item id -> its transcript entry
    entries: new Map(), // response id -> {entry, el}
    answers: new Map(), // response id -> [the player's figures, the hooks.answers entry]
    delays: new AnswerDelayClock({ sampleRate: RATE }),
    userStopped: false,
    opened: false,
    lastError: null,
    startedAt: performance.now(),
  };
}

// ------------------------------------------------------------------------------------------- state display
function currentState() {
  if (!session) return hooks.state === "error" || hooks.state === "closed" ? hooks.state : "idle";
  if (["microphone", "connecting", "queued"].includes(session.phase)) return session.phase;
  if (session.phase === "closed" || session.phase === "error") return session.phase;
  if (session.paused) return "paused";
  if (session.duplex) return "duplex";
  if (player.playing) return "speaking";
  if (player.buffering) return "buffering";
  if (session.userSpeaking) return "hearing";
  if (session.responseId || session.awaitingResponse) return "thinking";
  return "listening";
}

function render() {
  const visual = currentState();
  hooks.state = visual === "hearing" ? "listening" : visual;
  const [label, detail] = labels[visual];
  els.orb.dataset.state = visual === "duplex" ? (player.playing ? "speaking" : "listening") : visual;
  els.label.textContent = label;
  if (visual === "queued" && session) {
    // the place is announced when it changes; the wait ticking down beside it is not
    els.detail.replaceChildren(session.queuePlace,
      h("span", { "aria-live": "off" }, session.queueWait ? ` · ${session.queueWait}` : ""));
  } else if (visual === "paused" && session.pauseTimeoutS) {
    els.detail.textContent = `${detail} A pause longer than ${formatSeconds(session.pauseTimeoutS)} ends the session.`;
  } else {
    els.detail.textContent = detail;
  }
  const live = session && session.phase === "live";
  els.start.disabled = Boolean(session);
  if (presets) presets.element.disabled = Boolean(session); // a preset applies when a session starts
  els.stop.disabled = !session;
  els.stop.textContent = visual === "queued" ? "Leave queue" : "Stop";
  els.pause.disabled = !live || session.duplex;
  if (turns) { // a full-duplex model decides itself when to speak
    turns.element.disabled = Boolean(session && session.duplex);
    turns.element.title = session && session.duplex ? "This model listens and speaks at the same time" : "";
  }
  els.pause.textContent = live && session.paused ? "Resume" : "Pause";
  els.pause.setAttribute("aria-pressed", String(Boolean(live && session.paused)));
  if (!live || !session.sending) els.meter.style.width = "0";
}

/** Show `message` in the page's error box (none: hide it); kept in the hooks' `errors`. */
export function showError(message) {
  if (message) hooks.errors.push(message);
  els.error.textContent = message || "";
  els.error.classList.toggle("hidden", !message);
}

function showSessionLink(id) {
  if (!id) return;
  hooks.sessionId = id;
  els.sessionLink.replaceChildren("This session is recorded: ",
    h("a", { href: `/s/${encodeURIComponent(id)}`, title: id }, "view the recording"));
  els.sessionLink.classList.remove("hidden");
}

// ------------------------------------------------------------------------------------------- sending
function send(event) {
  if (session && session.ws && session.ws.readyState === WebSocket.OPEN) session.ws.send(JSON.stringify(event));
}

/** Ask the running session to end turns as `detection` says (an audio.input.turn_detection). */
function sendTurnDetection(detection) {
  send({ type: "session.update",
    session: { type: "realtime", audio: { input: { turn_detection: detection } } } });
}

const PREROLL_CHUNKS = Math.ceil(1000 / CHUNK_MS);

function onMicChunk(samples, rms) {
  if (!session) return;
  if (!session.sending) {
    // what is said while the session opens is kept (the last second) and sent once it is live
    if (session.phase !== "live" && !session.paused) {
      session.preroll.push(samples);
      if (session.preroll.length > PREROLL_CHUNKS) session.preroll.shift();
    }
    return;
  }
  els.meter.style.width = `${Math.min(100, Math.round(rms * 400))}%`;
  sendAudio(samples);
}

function sendAudio(samples) {
  send({ type: "input_audio_buffer.append", audio: bytesToBase64(new Uint8Array(floatToPcm16(samples).buffer)) });
  session.delays.sent(samples.length);
}

/** Ask for the microphone (and what the page adds to it); true once they run. Their input is held until the session
 * is live (see onMicChunk). */
async function openInputs(current) {
  const mic = new MicCapture({ targetRate: RATE, chunkMs: CHUNK_MS, onChunk: onMicChunk });
  current.mic = mic;
  try {
    await mic.start();
    await extension.openInputs?.();
  } catch (error) {
    mic.stop();
    extension.closeInputs?.();
    if (session === current) {
      session = null; // nothing was opened: no connection, no place in the queue
      hooks.state = "error";
      render();
    }
    showError(error.message);
    return false;
  }
  if (session !== current) { // stopped while the browser asked for permission
    mic.stop();
    extension.closeInputs?.();
    return false;
  }
  return true;
}

/** The session is live: send what the microphone heard while it opened, then everything as it comes. */
function startSending(current) {
  if (!current.mic) return;
  for (const samples of current.preroll.splice(0)) sendAudio(samples);
  current.sending = !current.paused;
  current.mic.setEnabled(!current.paused);
  extension.onSendingChange?.(current.sending);
  render();
}

// ------------------------------------------------------------------------------------------- server events
function assistantEntry(responseId) {
  let item = session.entries.get(responseId);
  if (!item) {
    item = transcript.add("assistant", "");
    session.entries.set(responseId, item);
  }
  return item;
}

const HANDLERS = {
  queued(event) { HANDLERS.queue_update(event); },
  queue_update(event) {
    const position = Number(event.position ?? 0);
    session.phase = position > 0 ? "queued" : "connecting";
    if (!session.countdown) {
      const current = session;
      current.countdown = new QueueCountdown((place, wait) => {
        current.queuePlace = place;
        current.queueWait = wait;
        if (session === current) render();
      });
    }
    session.countdown.update(event);
  },
  queue_done(event) {
    session.countdown?.stop();
    session.phase = "connecting";
    hooks.worker = event.worker ?? null;
    showSessionLink(event.session_id);
  },
  "session.created"(event) {
    session.phase = "live";
    if (event.session?.audio?.input?.turn_detection === null) { // a full-duplex model: just talk
      session.duplex = true;
      hooks.duplex = true;
      startSending(session);
      return;
    }
    send({
      type: "session.update",
      session: realtimeSession(presets.current(), {
        type: "realtime",
        output_modalities: ["audio"],
        audio: {
          input: { format: { type: "audio/pcm", rate: RATE }, turn_detection: { type: "server_vad" } },
          output: { format: { type: "audio/pcm", rate: RATE }, voice: "default" },
        },
      }),
    });
    // separately, so a server without a transcription pipeline refuses only this (ignored below)
    send({ type: "session.update",
      session: { type: "realtime", audio: { input: { transcription: { model: "whisper-1" } } } } });
    const detection = turns.current();
    if (detection.type !== "server_vad") sendTurnDetection(detection);
    startSending(session);
  },
  "input_audio_buffer.speech_started"() {
    session.userSpeaking = true;
    if (session.idleWarned) { // speaking keeps the session: the warning no longer holds
      session.idleWarned = false;
      showError("");
    }
    // barge-in: silence the answer now; the server cancels it and its late audio is ignored
    if (session.responseId || player.playing) {
      hooks.interruptions.push({ response_id: session.responseId, playing: player.playing,
        t_ms: Math.round(performance.now() - session.startedAt) });
    }
    if (session.responseId) session.interrupted.add(session.responseId);
    player.stop();
  },
  "session.updated"(event) {
    const detection = event.session?.audio?.input?.turn_detection;
    hooks.turnDetection = detection ?? null;
    const silenceMs = detection?.silence_duration_ms;
    if (silenceMs) session.delays.silenceMs = silenceMs;
  },
  "input_audio_buffer.speech_stopped"(event) {
    session.userSpeaking = false;
    session.awaitingResponse = true;
    session.delays.speechStopped(Number(event.audio_end_ms));
  },
  "conversation.item.added"(event) {
    const item = event.item || {};
    if (item.role !== "user") return;
    const parts = item.content || [];
    const text = parts.map((p) => p.text || p.transcript || "").join(" ").trim();
    const spoken = parts.some((p) => p.type === "input_audio");
    const entry = transcript.add("user", text || (spoken ? "(spoken)" : "(empty)"));
    if (spoken && text) transcript.setTag(entry, "spoken", "spoken");
    if (spoken && item.id) session.spokenItems.set(item.id, entry);
  },
  "conversation.item.input_audio_transcription.completed"(event) {
    const entry = session.spokenItems.get(event.item_id);
    if (!entry || !event.transcript) return;
    transcript.setText(entry, event.transcript);
    transcript.setTag(entry, "spoken", "spoken");
  },
  "response.created"(event) {
    session.awaitingResponse = false;
    session.responseId = event.response.id;
    assistantEntry(event.response.id);
    player.jitterBuffer = hooks.jitterBuffer !== false;
    const figures = { response_id: event.response.id };
    hooks.answers.push(figures);
    session.answers.set(event.response.id, [player.startAnswer(event.response.id), figures]);
    session.delays.responseCreated(event.response.id);
  },
  "response.output_audio_transcript.delta"(event) { HANDLERS["response.output_text.delta"](event); },
  "response.output_text.delta"(event) {
    const item = assistantEntry(event.response_id);
    transcript.setText(item, item.entry.text + event.delta);
  },
  "response.output_audio.delta"(event) {
    if (session.interrupted.has(event.response_id)) return;
    hooks.audioChunksReceived += 1;
    const delay = session.delays.audioArrived(event.response_id);
    if (delay !== null) showDelay(event.response_id, delay);
    player.enqueue(base64ToBytes(event.delta));
  },
  "response.done"(event) {
    const response = event.response || {};
    player.endAnswer(response.id);
    if (session.responseId === response.id) session.responseId = null;
    session.awaitingResponse = false;
    const item = session.entries.get(response.id);
    if (!item) return;
    if (response.status === "cancelled") transcript.setTag(item, "interrupted", "interrupted");
    else if (response.status === "failed") transcript.setTag(item, "failed", "failed");
    else item.entry.status = "completed";
    if (!item.entry.text) {
      const words = { completed: "(no words)", cancelled: "(stopped before it said anything)" };
      item.bubble.textContent = words[response.status] || "(no answer)";
    }
  },
  "session.idle_warning"(event) {
    const seconds = Math.round(Number(event.closes_in_s) || 15);
    showError(`Nobody has spoken for a while: this session ends in ${seconds} s unless you speak, to give its place `
      + "to someone waiting.");
    session.idleWarned = true;
  },
  "session.paused"(event) {
    session.paused = true;
    session.pauseTimeoutS = Number(event.pause_timeout_s) || null;
  },
  "session.resumed"() { session.paused = false; },
  error(event) {
    const err = event.error || {};
    if (err.code === "unsupported_feature" && err.param === "session.audio.input.transcription") return;
    if ((err.param || "").startsWith("session.audio.input.turn_detection")) {
      showError(`Answering when you pause: this server cannot hear when you finish (${err.message})`);
      return; // the session goes on with the server VAD
    }
    const message = describeError(new ApiError(0, err.message || "The server reported an error.", {
      code: err.code ?? null, retryAfter: err.retry_after_s ? Math.ceil(err.retry_after_s) : null }));
    session.lastError = message;
    showError(message);
  },
};

/** An answer's first audio came `delay` ms after the end of the speech it answers: shown under it and in the median. */
function showDelay(responseId, delay) {
  const figures = session.answers.get(responseId)?.[1];
  if (figures) figures.speech_end_to_first_audio_ms = delay; // whole ms, as the clock keeps it
  transcript.addNote(assistantEntry(responseId), delayNote(delay));
  showDelaySummary(session.delays, els.delays);
}

/** Copy the player's figures of an answer into its hooks.answers entry. */
function updateAnswerFigures(responseId) {
  const pair = session && session.answers.get(responseId);
  if (pair) copyAnswerFigures(pair[0], pair[1], session.startedAt);
}

function onMessage(current, raw) {
  if (session !== current) return;
  let event;
  try {
    event = JSON.parse(raw.data);
  } catch {
    return;
  }
  logEvent(hooks, event, sessionTime());
  HANDLERS[event.type]?.(event);
  extension.handlers?.[event.type]?.(event);
  if (event.response_id || event.response) updateAnswerFigures(event.response_id || event.response.id);
  render();
}

const CLOSE_REASONS = {
  1006: "The connection was lost.",
  1008: "The server refused the session.",
  1011: "The worker serving this session failed.",
  1013: "The service is busy; try again in a moment.",
};

function onClose(current, event) {
  if (session !== current) return;
  const wasLive = current.phase === "live";
  cleanup(current);
  if (current.userStopped) {
    hooks.state = "closed";
  } else if (event.code === 1000 && wasLive) {
    hooks.state = "closed";
    if (!current.lastError) showError("");
  } else {
    hooks.state = "error";
    const reason = CLOSE_REASONS[event.code]
      || `The session closed (code ${event.code}${event.reason ? `: ${event.reason}` : ""}).`;
    if (current.lastError) showError(`${current.lastError} ${reason}`);
    else if (!current.opened) showError("Cannot connect to the voice service. Is the gateway running?");
    else showError(reason);
  }
  session = null;
  render();
}

// ------------------------------------------------------------------------------------------- controls
async function start() {
  if (session) return;
  showError("");
  player.resume(); // inside the click: browsers only allow sound after a user gesture
  const current = newSession();
  session = current;
  showDelaySummary(current.delays, els.delays);
  render();
  // the microphone first: without it there is no session, and no place in the queue is taken
  if (!(await openInputs(current))) return;
  current.phase = "connecting";
  const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(`${scheme}//${window.location.host}/v1/realtime`);
  current.ws = ws;
  ws.onopen = () => { current.opened = true; };
  ws.onmessage = (event) => onMessage(current, event);
  ws.onclose = (event) => onClose(current, event);
  render();
}

function cleanup(current) {
  current.countdown?.stop();
  current.sending = false;
  current.phase = current.userStopped ? "closed" : current.phase;
  if (current.mic) current.mic.stop();
  current.mic = null;
  extension.onSendingChange?.(false);
  extension.closeInputs?.();
  player.stop();
}

function stop() {
  const current = session;
  if (!current) return;
  current.userStopped = true;
  cleanup(current);
  if (current.ws && current.ws.readyState <= WebSocket.OPEN) current.ws.close(1000, "stopped by the user");
  session = null;
  hooks.state = "closed";
  render();
}

function togglePause() {
  if (!session || session.phase !== "live") return;
  const pause = !session.paused;
  send({ type: pause ? "session.pause" : "session.resume" });
  session.paused = pause;
  session.sending = !pause && Boolean(session.mic && session.mic.active);
  if (session.mic) session.mic.setEnabled(!pause);
  extension.onSendingChange?.(session.sending);
  if (pause) {
    session.userSpeaking = false;
    session.delays.bufferEmptied(); // the server drops its uncommitted audio
  }
  render();
}

/** Send a client event on the live session's WebSocket (nothing when there is none). */
export function sendEvent(event) {
  send(event);
}

/** Milliseconds since the running session started (the events' `t_ms` clock); null without a session. */
export function sessionTime(at = performance.now()) {
  return session ? Math.round(at - session.startedAt) : null;
}

/**
 * Run the page in the document (its elements have the voice page's ids) and return its hooks, also kept as
 * `window[hooksName]`; its preset choice is remembered under `presetKey`. What a page adds to the spoken session:
 * - `labels`: its own words for some states ({state: [label, detail]}, see LABELS);
 * - `openInputs()`: opens its own inputs after the microphone (async; throws an Error with a readable message),
 *   `closeInputs()` closes them when the session ends;
 * - `onSendingChange(sending)`: input goes to the server from now on (live, not paused), or stops going;
 * - `handlers`: {event type: function(event)} run after the page's own handling of that server event.
 */
export function startDuplexPage({ hooksName, presetKey, labels: pageLabels = {}, ...pageExtension }) {
  els = findElements();
  hooks = newHooks();
  window[hooksName] = hooks;
  transcript = new VoiceTranscript(els.transcript, hooks.transcript);
  labels = { ...LABELS, ...pageLabels };
  extension = pageExtension;
  presets = mountPresetSelector($("#presets"), { storageKey: `omnipipe.preset.${presetKey}` });
  turns = mountTurnDetection($("#turn-detection"), { storageKey: `omnipipe.turn.${presetKey}`,
    onChange: (detection) => { if (session && session.phase === "live") sendTurnDetection(detection); } });
  els.start.addEventListener("click", start);
  els.stop.addEventListener("click", stop);
  els.pause.addEventListener("click", togglePause);
  window.addEventListener("pagehide", stop);
  render();
  return hooks;
}
