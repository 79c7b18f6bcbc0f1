// Chat page: streamed chat completions with optional spoken answers, and drawn ones.
//
// One turn: POST /v1/chat/completions with stream=true and "X-Omnipipe-Queue-Events: 1", read the SSE stream
// (queue events first, then the completion chunks), put text deltas into the conversation, play audio deltas
// (base64 pcm16, 24 kHz) as they arrive. A model that draws (output_modalities with "image") is asked for
// images with previews: each delta.images entry is a PNG data URL, a preview of the image being drawn when it has
// the denoising step ({step, steps}), else the finished image (after the text); each replaces the one shown.
// The gateway's X-Omnipipe-Session-Id header names the recording; it is sent back on later turns so the whole
// conversation lands in one recording. A preset (presets.js) adds its instructions as the system message, its
// voice, and sets whether the answer is spoken.

import { apiErrorFrom, ApiError, describeError, fetchJSON, servedModel } from "./api.js";
import { base64ToBytes, blobToDataURL, bytesToBase64 } from "./base64.js";
import { $, formatSeconds, h } from "./dom.js";
import { MicCapture } from "./mic.js";
import { PcmPlayer } from "./pcm-player.js";
import { chatMessages, mountPresetSelector } from "./presets.js";
import { QueueCountdown } from "./queue.js";
import { readSSE } from "./sse.js";
import { concatBytes, concatFloat32, encodeWav, fileToWav, wavFromPcm16 } from "./wav.js";

const RATE = 24000;
const MAX_RECORDING_S = 120;
const MAX_VIDEO_BYTES = 20e6; // the server takes bodies of up to 32 MiB, and base64 makes a file a third larger
const SPEAK_KEY = "omnipipe.chat.speak";
const PREVIEW_EVERY = 10; // denoising steps between previews of an image being drawn (the digits model takes 25)
const DRAWING_STAGE = "diffusion"; // the stage that draws, in the image pipelines

const els = {
  log: $("#log"),
  placeholder: $("#placeholder"),
  form: $("#composer"),
  prompt: $("#prompt"),
  attachments: $("#attachments"),
  record: $("#record"),
  attachAudio: $("#attach-audio"),
  audioFile: $("#audio-file"),
  attachImage: $("#attach-image"),
  imageFile: $("#image-file"),
  attachVideo: $("#attach-video"),
  videoFile: $("#video-file"),
  speak: $("#speak"),
  send: $("#send"),
  stop: $("#stop"),
  queue: $("#queue-status"),
  queueText: $("#queue-text"),
  queueWait: $("#queue-wait"),
  sessionInfo: $("#session-info"),
  newChat: $("#new-chat"),
  error: $("#composer-error"),
};

/** Hooks for tests and curious developers. */
const hooks = {
  audioChunksReceived: 0,
  lastMetrics: null,
  sessionId: null,
  busy: false,
  lastAnswer: "",
  lastError: null,
  turnsCompleted: 0, // answered, failed or stopped
  model: null, // {id, input, output} as /v1/models says
  heard: [], // what the server heard in each spoken question, in order
  previewsReceived: 0, // previews of images being drawn, over all turns
  imagesReceived: 0, // finished images, over all turns
  lastImage: null, // the data URL of the last finished image
};
window.omnipipeChat = hooks;

const state = {
  history: [], // messages already answered, as sent on later turns
  sessionId: null,
  audio: null, // {wav: Uint8Array, label, url}
  image: null, // {dataUrl, label}
  video: null, // {dataUrl, label, url}
  recorder: null, // {mic, pieces, started, timer}
  controller: null,
  ticketId: null,
  queued: false,
};

const player = new PcmPlayer({ sampleRate: RATE });

// ------------------------------------------------------------------------------------------- small UI helpers
function showError(message) {
  els.error.textContent = message;
  els.error.classList.toggle("hidden", !message);
}

function scrollToEnd() {
  els.log.scrollTop = els.log.scrollHeight;
}

function setSession(id) {
  if (!id || id === state.sessionId) return;
  state.sessionId = id;
  hooks.sessionId = id;
  els.sessionInfo.replaceChildren("Recorded session ", h("a", { href: `/s/${encodeURIComponent(id)}` }, id));
}

function setBusy(busy) {
  hooks.busy = busy;
  els.log.setAttribute("aria-busy", String(busy)); // screen readers read the answer once it is complete
  els.send.disabled = busy;
  els.stop.classList.toggle("hidden", !busy);
  els.newChat.disabled = busy;
}

function forgetSession() {
  state.sessionId = null;
  hooks.sessionId = null;
  els.sessionInfo.textContent = "New conversation";
}

/** The place in the queue (announced when it changes) and the wait counted down beside it (not announced). */
function showQueue(place, wait = "") {
  els.queueText.textContent = place || "";
  els.queueWait.textContent = wait ? ` · ${wait}` : "";
  els.queue.classList.toggle("hidden", !place);
}

const countdown = new QueueCountdown(showQueue);

/** Append a message; `withBubble` false leaves out the text bubble (a question that is only audio or an image). */
function addMessage(role, { text = "", withBubble = true, extras = [] } = {}) {
  els.placeholder?.remove();
  const bubble = withBubble ? h("div", { class: "bubble" }, text) : null;
  const message = h("article", { class: `msg ${role}`, "aria-label": role === "user" ? "You" : "Assistant" },
    h("span", { class: "who" }, role === "user" ? "You" : "Assistant"), bubble, ...extras);
  els.log.append(message);
  scrollToEnd();
  return { message, bubble };
}

// ------------------------------------------------------------------------------------------- attachments
function renderAttachments() {
  const chips = [];
  if (state.audio) {
    chips.push(h("span", { class: "chip" }, state.audio.label,
      h("button", { type: "button", "aria-label": `Remove ${state.audio.label}`, onclick: () => setAudio(null) }, "×")));
  }
  if (state.image) {
    chips.push(h("span", { class: "chip" }, state.image.label,
      h("button", { type: "button", "aria-label": `Remove ${state.image.label}`, onclick: () => setImage(null) }, "×")));
  }
  if (state.video) {
    chips.push(h("span", { class: "chip" }, state.video.label,
      h("button", { type: "button", "aria-label": `Remove ${state.video.label}`, onclick: () => setVideo(null) }, "×")));
  }
  els.attachments.replaceChildren(...chips);
}

function setAudio(audio) {
  if (state.audio && state.audio.url && !state.audio.sent) URL.revokeObjectURL(state.audio.url);
  state.audio = audio;
  renderAttachments();
}

function setImage(image) {
  state.image = image;
  renderAttachments();
}

function setVideo(video) {
  if (state.video && !state.video.sent) URL.revokeObjectURL(state.video.url);
  state.video = video;
  renderAttachments();
}

async function toggleRecording() {
  showError("");
  if (state.recorder) {
    await stopRecording();
    return;
  }
  const pieces = [];
  const mic = new MicCapture({ targetRate: RATE, chunkMs: 100, onChunk: (samples) => pieces.push(samples) });
  try {
    await mic.start();
  } catch (error) {
    showError(error.message);
    return;
  }
  const started = performance.now();
  const label = els.record.querySelector(".label");
  const tick = () => {
    const seconds = (performance.now() - started) / 1000;
    label.textContent = `Stop recording (${seconds.toFixed(0)} s)`;
    if (seconds >= MAX_RECORDING_S) stopRecording();
  };
  state.recorder = { mic, pieces, started, timer: setInterval(tick, 250) };
  tick();
  els.record.classList.add("recording");
  els.record.setAttribute("aria-pressed", "true");
}

async function stopRecording() {
  const recorder = state.recorder;
  if (!recorder) return;
  state.recorder = null;
  clearInterval(recorder.timer);
  await recorder.mic.flush();
  await recorder.mic.stop();
  els.record.classList.remove("recording");
  els.record.setAttribute("aria-pressed", "false");
  els.record.querySelector(".label").textContent = "Record";
  const samples = concatFloat32(recorder.pieces);
  if (samples.length < RATE / 10) {
    showError("The recording is empty. Check that the microphone works and try again.");
    return;
  }
  const wav = encodeWav(samples, RATE);
  const url = URL.createObjectURL(new Blob([wav], { type: "audio/wav" }));
  setAudio({ wav, url, label: `Recording (${(samples.length / RATE).toFixed(1)} s)` });
  els.prompt.focus();
}

async function attachAudioFile(file) {
  showError("");
  try {
    const { wav, duration } = await fileToWav(file, RATE);
    const url = URL.createObjectURL(new Blob([wav], { type: "audio/wav" }));
    setAudio({ wav, url, label: `${file.name} (${duration.toFixed(1)} s)` });
  } catch (error) {
    showError(error.message);
  }
}

async function attachImageFile(file) {
  showError("");
  if (!file.type.startsWith("image/")) {
    showError(`"${file.name}" is not an image.`);
    return;
  }
  setImage({ dataUrl: await blobToDataURL(file), label: file.name });
}

async function attachVideoFile(file) {
  showError("");
  if (!file.type.startsWith("video/")) {
    showError(`"${file.name}" is not a video.`);
    return;
  }
  if (file.size > MAX_VIDEO_BYTES) {
    showError(`"${file.name}" is ${(file.size / 1e6).toFixed(1)} MB; videos of up to ${MAX_VIDEO_BYTES / 1e6} MB can be sent.`);
    return;
  }
  // the server decodes it and samples its frames; sent whole as a data URL
  setVideo({ dataUrl: await blobToDataURL(file), label: file.name, url: URL.createObjectURL(file) });
}

// ------------------------------------------------------------------------------------------- one turn
/** Earlier turns go along as text (a model that takes the conversation reads them): audio and images are not
 * resent; a spoken question becomes what the server heard in it once that is known. */
function compactForHistory(content) {
  if (typeof content === "string") return content;
  const text = content.filter((p) => p.type === "text").map((p) => p.text).join(" ").trim();
  if (text) return text;
  if (content.some((p) => p.type === "input_audio")) return "(spoken question)";
  return content.some((p) => p.type === "video_url") ? "(video)" : "(image)";
}

function metricsLine(metrics) {
  const item = (name, title, value) => h("span", { title }, `${name} `, h("b", {}, formatSeconds(value, 2)));
  return h("div", { class: "meta", "data-metrics": "" },
    metrics.ttft_s !== null ? item("TTFT", "time to first text, from sending", metrics.ttft_s) : null,
    metrics.speak ? item("TTFP", "time to first audio, from sending", metrics.ttfp_s) : null,
    metrics.image_s !== null ? item("Image", "time until the image was drawn, from sending", metrics.image_s) : null,
    item("Total", "time until the answer was complete", metrics.total_s),
    metrics.queue_wait_s > 0.05 ? item("Queued", "time spent waiting in the queue", metrics.queue_wait_s) : null);
}

/** The image an answer draws, shown in its message: each preview replaces the last, then the finished image. */
class AnswerDrawing {
  constructor(message) {
    this.message = message;
    this.figure = null;
    this.progress = null; // {step, steps} of the preview shown; null when none or finished
    this.finished = false;
  }

  /** Show `url` (a PNG data URL): a preview with `progress` ({step, steps}), else the finished image. */
  show(url, progress) {
    if (!this.figure) {
      this.img = h("img", { class: "drawn", onload: scrollToEnd });
      this.caption = h("figcaption", {});
      this.figure = h("figure", { class: "drawing" }, this.img, this.caption);
      this.message.querySelector(".bubble").after(this.figure);
    }
    this.img.src = url;
    this.finished = !progress;
    this.progress = progress;
    this.figure.classList.toggle("preview", !this.finished);
    this.img.dataset.image = this.finished ? "final" : "preview";
    if (this.finished) {
      this.img.alt = "The drawn image";
      this.caption.replaceChildren(h("a", { href: url, download: "drawing.png" }, "Save the image"));
    } else {
      const of = Number.isFinite(progress.steps) ? ` of ${progress.steps}` : "";
      this.img.alt = `The image being drawn (step ${progress.step}${of})`;
      this.caption.textContent = `Drawing… step ${progress.step}${of}`;
    }
  }

  /** The answer ended without its finished image: the last preview stays, marked as unfinished. */
  unfinished() {
    if (!this.figure || this.finished) return;
    this.figure.classList.add("unfinished");
    const { step, steps } = this.progress || {};
    this.caption.textContent = `Not finished: the last preview (step ${step}${Number.isFinite(steps) ? ` of ${steps}` : ""})`;
  }
}

/** The modalities to ask for: text, audio if the answer should be spoken, images if the model draws; only those the
 * model answers with (when /v1/models says). */
function wantedModalities(model, speak) {
  const draws = Boolean(model.output && model.output.includes("image"));
  const wanted = ["text", speak ? "audio" : null, draws ? "image" : null].filter(Boolean);
  const answered = model.output ? wanted.filter((m) => model.output.includes(m)) : wanted;
  return answered.length ? answered : wanted;
}

async function send(event) {
  event?.preventDefault();
  if (hooks.busy) return;
  showError("");
  if (state.recorder) await stopRecording();
  const text = els.prompt.value.trim();
  if (!text && !state.audio && !state.image && !state.video) {
    showError("Type a question, record one, or attach an audio file first.");
    els.prompt.focus();
    return;
  }
  const speak = els.speak.checked;
  if (speak) player.resume(); // inside the click: browsers only allow sound after a user gesture
  player.stop();
  player.startAnswer();
  setBusy(true);

  // the user's message, as sent and as shown
  const parts = [];
  if (text) parts.push({ type: "text", text });
  if (state.audio) parts.push({ type: "input_audio", input_audio: { data: bytesToBase64(state.audio.wav), format: "wav" } });
  if (state.image) parts.push({ type: "image_url", image_url: { url: state.image.dataUrl } });
  if (state.video) parts.push({ type: "video_url", video_url: { url: state.video.dataUrl } });
  const content = parts.length === 1 && text ? text : parts;
  const userShown = addMessage("user", {
    text,
    withBubble: Boolean(text),
    extras: [
      state.audio ? h("audio", { controls: true, src: state.audio.url, "aria-label": "Your spoken question" }) : null,
      state.image ? h("img", { class: "thumb", src: state.image.dataUrl, alt: state.image.label }) : null,
      state.video ? h("video", { class: "thumb", src: state.video.url, controls: true, muted: true,
        "aria-label": state.video.label }) : null,
    ],
  });
  if (state.audio) state.audio.sent = true;
  if (state.video) state.video.sent = true;
  const spokenWav = state.audio ? state.audio.wav : null;
  const heardLine = spokenWav ? h("div", { class: "heard muted small", "aria-live": "polite" }, "Listening to your question…") : null;
  if (heardLine) userShown.message.append(heardLine);
  els.prompt.value = ""; // given back below if the question is not answered
  setAudio(null);
  setImage(null);
  setVideo(null);

  const userMessage = { role: "user", content };
  const remembered = { role: "user", content: compactForHistory(content) }; // becomes what was heard, if spoken
  const assistant = addMessage("assistant");
  const model = await servedModel();
  const modalities = wantedModalities(model, speak);
  const body = {
    model: model.id,
    messages: chatMessages(presets.current(), model.conversation ? [...state.history, userMessage] : [userMessage]),
    stream: true,
    modalities,
  };
  if (modalities.includes("audio")) body.audio = { voice: presets.current()?.voice || "default", format: "pcm16" };
  if (modalities.includes("image")) {
    body.omnipipe = { sampling_params: { [DRAWING_STAGE]: { extra: { preview_every: PREVIEW_EVERY } } } };
  }
  body.stream_options = { include_usage: true }; // the token count goes into the recording
  const headers = { "Content-Type": "application/json", Accept: "text/event-stream", "X-Omnipipe-Queue-Events": "1" };
  if (state.sessionId) headers["X-Omnipipe-Session-Id"] = state.sessionId;

  const hadSession = state.sessionId;
  const controller = new AbortController();
  state.controller = controller;
  state.ticketId = null;
  const sentAt = performance.now();
  const since = () => (performance.now() - sentAt) / 1000;
  const metrics = { speak, ttft_s: null, ttfp_s: null, image_s: null, total_s: null, queue_wait_s: 0 };
  const pcmPieces = [];
  const drawing = new AnswerDrawing(assistant.message);
  let answer = "";
  let failure = null;
  let stopped = false;
  let complete = false;
  hooks.lastError = null;

  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers, body: JSON.stringify(body), signal: controller.signal,
    });
    // the recording exists once the request is served (queue_done below), not while it waits: a request
    // cancelled in the queue leaves none to link to
    if (!response.ok) throw await apiErrorFrom(response);
    for await (const sse of readSSE(response)) {
      if (sse.event === "queue") {
        const queueEvent = JSON.parse(sse.data);
        if (queueEvent.ticket_id) state.ticketId = queueEvent.ticket_id;
        state.queued = queueEvent.type !== "queue_done";
        if (queueEvent.type === "queue_done") {
          metrics.queue_wait_s = since();
          setSession(queueEvent.session_id);
          if (spokenWav) transcribe(spokenWav, queueEvent.session_id, heardLine, remembered);
        }
        if (queueEvent.type === "queue_done") {
          countdown.stop();
          showQueue("");
        } else {
          countdown.update(queueEvent);
        }
        continue;
      }
      if (sse.data === "[DONE]") {
        complete = true;
        break;
      }
      const chunk = JSON.parse(sse.data);
      if (chunk.error) {
        failure = new ApiError(0, chunk.error.message || "The answer failed.",
          { code: chunk.error.code ?? null, type: chunk.error.type ?? null });
        break;
      }
      const delta = chunk.choices && chunk.choices[0] ? chunk.choices[0].delta || {} : {};
      // a spoken answer's words come as its audio's transcript, a written one's as content
      const words = delta.content || (delta.audio && delta.audio.transcript) || "";
      if (words) {
        if (metrics.ttft_s === null) metrics.ttft_s = since();
        answer += words;
        assistant.bubble.textContent = answer;
        scrollToEnd();
      }
      if (delta.audio && delta.audio.data) {
        if (metrics.ttfp_s === null) metrics.ttfp_s = since();
        const bytes = base64ToBytes(delta.audio.data);
        pcmPieces.push(bytes);
        hooks.audioChunksReceived += 1;
        player.enqueue(bytes);
      }
      for (const image of Array.isArray(delta.images) ? delta.images : []) {
        const url = image && image.image_url && typeof image.image_url.url === "string" ? image.image_url.url : "";
        if (!url.startsWith("data:image/")) continue; // only pictures go into an <img>
        const preview = typeof image.step === "number";
        drawing.show(url, preview ? { step: image.step, steps: image.steps } : null);
        if (preview) {
          hooks.previewsReceived += 1;
        } else {
          metrics.image_s = since();
          hooks.imagesReceived += 1;
          hooks.lastImage = url;
          if (!answer) assistant.bubble.classList.add("hidden"); // an answer that is only an image
        }
        scrollToEnd();
      }
    }
  } catch (error) {
    if (error.name === "AbortError") stopped = true;
    else if (error instanceof TypeError) failure = new ApiError(0, `Cannot reach the server (${error.message}).`);
    else failure = error;
  }
  if (!complete && !failure && !stopped) failure = new ApiError(0, "The connection closed before the answer was complete.");
  player.endAnswer();
  metrics.total_s = since();
  countdown.stop();
  showQueue("");
  state.controller = null;
  state.queued = false;
  setBusy(false);

  if (!complete) drawing.unfinished();
  if (failure || (stopped && !answer)) assistant.bubble.classList.remove("hidden");
  if (failure) {
    assistant.message.classList.add("error");
    assistant.bubble.replaceChildren(answer ? `${answer}\n\n` : "", h("strong", {}, "No answer. "),
      describeError(failure));
    hooks.lastError = describeError(failure);
    if (!hadSession && failure.type === "invalid_request_error") forgetSession(); // refused: nothing was recorded
  } else if (stopped) {
    assistant.bubble.textContent = answer ? `${answer} (stopped)` : "(stopped)";
  }
  if ((failure || stopped) && !answer && text && !els.prompt.value.trim()) {
    els.prompt.value = text; // the question was not answered: keep it to send again
  }
  if (heardLine && !state.heardStarted) heardLine.remove();
  state.heardStarted = false;
  if (pcmPieces.length) {
    const wav = wavFromPcm16(concatBytes(pcmPieces), RATE);
    const url = URL.createObjectURL(new Blob([wav], { type: "audio/wav" }));
    assistant.message.append(h("audio", { controls: true, src: url, "aria-label": "The spoken answer" }));
  }
  if (!failure && !stopped) {
    assistant.message.append(metricsLine(metrics));
    hooks.lastMetrics = metrics;
    hooks.lastAnswer = answer;
    // only the text goes along on later turns; a drawn image stays on the page
    state.history.push(remembered, { role: "assistant", content: answer || (drawing.finished ? "(image)" : "") });
  }
  hooks.turnsCompleted += 1;
  scrollToEnd();
  els.prompt.focus();
}

/** What the server heard in a spoken question, shown under it; asked from /v1/audio/transcriptions at the same
 * time as the answer. The chat's session id goes along, so the gateway puts the transcript into that recording. */
async function transcribe(wav, sessionId, line, remembered) {
  state.heardStarted = true;
  const form = new FormData();
  form.append("file", new Blob([wav], { type: "audio/wav" }), "question.wav");
  form.append("model", (await servedModel()).id);
  const headers = sessionId ? { "X-Omnipipe-Session-Id": sessionId } : {};
  let shown;
  try {
    const response = await fetch("/v1/audio/transcriptions", { method: "POST", body: form, headers });
    if (!response.ok) throw await apiErrorFrom(response);
    const reply = await response.json();
    const heard = String(reply.text || "").trim();
    hooks.heard.push(heard);
    if (heard) remembered.content = remembered.content.startsWith("(") ? heard : `${remembered.content} ${heard}`;
    shown = heard ? ["Heard: ", h("q", {}, heard)] : ["Nothing was heard in this recording."];
  } catch (error) {
    hooks.heard.push(null);
    shown = ["What was heard is not available: ", describeError(error)];
  }
  line.replaceChildren(...shown);
}

/** Offer only what the served model takes: images, videos, audio; and speaking only when it can answer aloud. */
async function showCapabilities() {
  const model = await servedModel();
  hooks.model = model;
  const takes = (modality) => (model.input ? model.input.includes(modality) : modality !== "image");
  els.attachImage.classList.toggle("hidden", !takes("image"));
  els.attachVideo.classList.toggle("hidden", !takes("video"));
  els.record.classList.toggle("hidden", !takes("audio"));
  els.attachAudio.classList.toggle("hidden", !takes("audio"));
  const speaks = model.output ? model.output.includes("audio") : true;
  els.speak.closest("label").classList.toggle("hidden", !speaks);
  if (!speaks) els.speak.checked = false;
  const extras = [takes("audio") ? "record a question or attach an audio file" : "", takes("image") ? "attach an image" : "",
    takes("video") ? "attach a video" : ""].filter(Boolean);
  const draws = Boolean(model.output && model.output.includes("image"));
  if (els.placeholder && els.placeholder.isConnected) {
    els.placeholder.textContent = `Ask something to start.${extras.length ? ` You can also ${extras.join(", or ")}.` : ""}`
      + (draws ? " The answer comes with a drawing, e.g. for \u201cDraw the number of legs a spider has.\u201d" : "");
  }
  document.body.dataset.capabilities = "known";
}

async function stop() {
  const { controller, ticketId, queued } = state;
  player.stop();
  if (controller) controller.abort();
  if (queued && ticketId) {
    // leave the queue at once rather than when the gateway notices the closed connection
    fetchJSON(`/api/queue/${encodeURIComponent(ticketId)}`, { method: "DELETE" }).catch(() => {});
  }
}

function newConversation() {
  player.stop();
  state.history = [];
  forgetSession();
  els.log.replaceChildren(h("p", { class: "placeholder", id: "placeholder" }, "Ask something to start."));
  els.placeholder = $("#placeholder");
  els.prompt.focus();
}

// ------------------------------------------------------------------------------------------- wiring
els.speak.checked = localStorage.getItem(SPEAK_KEY) !== "0";
els.speak.addEventListener("change", () => localStorage.setItem(SPEAK_KEY, els.speak.checked ? "1" : "0"));
els.form.addEventListener("submit", send);
els.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    els.form.requestSubmit();
  }
});
els.record.addEventListener("click", toggleRecording);
els.attachAudio.addEventListener("click", () => els.audioFile.click());
els.attachImage.addEventListener("click", () => els.imageFile.click());
els.attachVideo.addEventListener("click", () => els.videoFile.click());
els.videoFile.addEventListener("change", () => {
  if (els.videoFile.files[0]) attachVideoFile(els.videoFile.files[0]);
  els.videoFile.value = "";
});
els.audioFile.addEventListener("change", () => {
  if (els.audioFile.files[0]) attachAudioFile(els.audioFile.files[0]);
  els.audioFile.value = "";
});
els.imageFile.addEventListener("change", () => {
  if (els.imageFile.files[0]) attachImageFile(els.imageFile.files[0]);
  els.imageFile.value = "";
});
els.stop.addEventListener("click", stop);
els.newChat.addEventListener("click", newConversation);
const presets = mountPresetSelector($("#presets"), { storageKey: "omnipipe.preset.chat", onChange(preset) {
  if (preset && !els.speak.closest("label").classList.contains("hidden")) {
    els.speak.checked = preset.output_modalities.includes("audio");
  }
} });
showCapabilities();
