// Session viewer (/s/{session_id}): metadata, the merged replay (the video of a session with camera frames, else the
// audio), every turn with its text, audio, images and metrics.
// Data: GET /api/sessions/{id} -> {session_id, meta, recording: {turns, events}, files, size_bytes, errors}.
// Opened by a share link (/shared/{token}) it reads the same data, read-only and without the session id, from
// /api/shared/{token} (no zip download: the archive names the session).

import { ApiError, describeError, fetchJSON } from "./api.js";
import { $, formatBytes, formatSeconds, formatTime, h, setChildren } from "./dom.js";

const SESSION_ID = /^[A-Za-z0-9_-]{1,128}$/;
const REPLAY = "merged_replay.wav";
const VIDEO_REPLAY = "merged_replay.mp4";
const LIVE_REFRESH_MS = 5000;

const els = {
  id: $("#session-id"),
  download: $("#download"),
  message: $("#message"),
  content: $("#content"),
  meta: $("#meta"),
  replay: $("#replay"),
  turns: $("#turns"),
  turnCount: $("#turn-count"),
  files: $("#files"),
  raw: $("#raw"),
};

const SHARED = window.location.pathname.startsWith("/shared/");
const sessionId = (() => { // for a share link, its token
  const tail = window.location.pathname.replace(/^\/(s|shared)\//, "").replace(/\/+$/, "");
  try {
    return decodeURIComponent(tail);
  } catch {
    return tail;
  }
})();
const API = `/api/${SHARED ? "shared" : "sessions"}/${encodeURIComponent(sessionId)}`;
let lastPayload = "";

function fileUrl(path) {
  return `${API}/files/${path.split("/").map(encodeURIComponent).join("/")}`;
}

function showMessage(kind, title, text, ...extra) {
  els.message.className = `notice ${kind}`;
  els.message.setAttribute("role", kind === "error" ? "alert" : "status");
  setChildren(els.message, title ? h("strong", {}, title) : null, text, ...extra);
  els.message.classList.remove("hidden");
}

function badge(status) {
  const kind = { completed: "ok", recording: "accent", in_progress: "accent", cancelled: "warn", failed: "danger" }[status] || "";
  return h("span", { class: `badge ${kind}` }, String(status || "unknown").replace("_", " "));
}

// ------------------------------------------------------------------------------------------- parts
function renderMeta(data) {
  const meta = data.meta || {};
  const rows = [
    ["Type", meta.type || "—"],
    ["Status", badge(meta.status)],
    ["Started", formatTime(meta.created_at)],
    ["Ended", meta.ended_at ? formatTime(meta.ended_at) : "still running"],
    ["Duration", meta.ended_at && meta.created_at ? formatSeconds(meta.ended_at - meta.created_at) : "—"],
    ["Worker", meta.worker ? h("span", { class: "mono" }, meta.worker) : "—"],
    ["Size", formatBytes(data.size_bytes)],
  ];
  if (meta.error) rows.push(["Error", h("span", { class: "badge danger" }, meta.error)]);
  if (meta.config && typeof meta.config === "object" && Object.keys(meta.config).length) {
    rows.push(["Settings", settingsList(meta.config)]);
  }
  setChildren(els.meta, rows.flatMap(([term, value]) => [h("dt", {}, term), h("dd", {}, value)]));
}

const SETTING_NAMES = { path: "Endpoint", model: "Model", voice: "Voice", modalities: "Answers with",
  output_modalities: "Answers with", type: "Session type",
  instructions: "Instructions", turn_detection: "Turn detection", output_audio_format: "Audio format" };

function settingText(value) {
  if (value === null || value === undefined || value === "") return "—";
  if (Array.isArray(value)) return value.map(settingText).join(", ");
  if (typeof value === "object") {
    return Object.entries(value).map(([k, v]) => `${k.replaceAll("_", " ")}: ${settingText(v)}`).join("; ");
  }
  if (typeof value === "boolean") return value ? "yes" : "no";
  return String(value);
}

/** A session's settings as a list of "name: value" lines (nested ones in words, not JSON). */
function settingsList(config) {
  return h("ul", { class: "settings" }, Object.entries(config).map(([name, value]) => {
    const label = SETTING_NAMES[name] || name.charAt(0).toUpperCase() + name.slice(1).replaceAll("_", " ");
    return h("li", { "data-setting": name }, h("span", { class: "muted" }, `${label}: `), settingText(value));
  }));
}

function renderReplay(data) {
  const files = data.files || [];
  if (files.includes(VIDEO_REPLAY)) {
    setChildren(els.replay,
      h("video", { class: "replay-video", controls: true, preload: "metadata", playsinline: true,
        src: fileUrl(VIDEO_REPLAY), "aria-label": "Video replay of the session" }),
      h("p", { class: "muted small" }, "Your camera as the model saw it, with your voice (left) and the model's (right)."));
  } else if (files.includes(REPLAY)) {
    setChildren(els.replay,
      h("audio", { controls: true, preload: "metadata", src: fileUrl(REPLAY), "aria-label": "Merged replay of the session" }),
      h("p", { class: "muted small" }, "Stereo: your side on the left, the model's on the right, aligned in time."));
  } else if ((data.meta || {}).status === "recording") {
    const note = (data.meta || {}).type === "chat"
      ? "The replay is written when the session ends (a chat ends after 5 minutes without a new question)."
      : "The replay is written when the session ends.";
    setChildren(els.replay, h("p", { class: "muted" }, note));
  } else {
    setChildren(els.replay, h("p", { class: "muted" }, "This session has no audio to replay."));
  }
}

function audioEntry(entry, label) {
  if (!entry || !entry.path) return null;
  const note = entry.decode_error
    ? h("p", { class: "small muted" }, "Kept as sent; it could not be decoded: ", entry.decode_error) : null;
  const duration = entry.duration_s ? ` (${formatSeconds(entry.duration_s)})` : "";
  return h("div", {},
    h("audio", { controls: true, preload: "metadata", src: fileUrl(entry.path), "aria-label": `${label}${duration}` }),
    h("div", { class: "small muted" }, h("a", { href: fileUrl(entry.path) }, entry.path), duration),
    note);
}

/** An image the answer drew (tiny: shown large with crisp pixels), linked to its file. */
function drawnImage(entry) {
  const size = entry.width && entry.height ? `${entry.width}×${entry.height} px, ` : "";
  return h("figure", { class: "drawing" },
    h("a", { href: fileUrl(entry.path) },
      h("img", { class: "drawn", src: fileUrl(entry.path), alt: `Image the assistant drew (${entry.path})` })),
    h("figcaption", { class: "small muted" }, `${size}${formatBytes(entry.size_bytes)}`));
}

function metricLabel(name) {
  const base = name.replace(/_(ms|s)$/, "");
  return base.length <= 4 ? base.toUpperCase() : base.replaceAll("_", " ");
}

function metricValue(name, value) {
  if (typeof value !== "number") return typeof value === "object" ? JSON.stringify(value) : String(value);
  if (name.endsWith("_ms")) return formatSeconds(value / 1000, 2);
  if (name.endsWith("_s")) return formatSeconds(value, 2);
  return Number.isInteger(value) ? String(value) : value.toFixed(3);
}

// a function the model called (realtime tools) and the output the client sent back for it
function toolCall(call) {
  return h("div", { class: "tool-call" },
    h("div", { class: "text" }, h("span", { class: "muted small" }, "Called "),
      h("code", {}, `${call.name}(${call.arguments || ""})`)),
    h("div", { class: "text" }, h("span", { class: "muted small" }, "Output: "),
      typeof call.output === "string" ? call.output : h("span", { class: "muted" }, "(none sent)")));
}

function renderTurn(turn) {
  const userClips = [turn.user_audio, ...(turn.user_audio_extra || [])].filter(Boolean);
  const aiClips = (turn.ai_audio || []).filter(Boolean);
  const images = (turn.user_images || []).filter((i) => i && i.path);
  const videos = (turn.user_videos || []).filter((v) => v && v.path);
  const drawn = (turn.ai_images || []).filter((i) => i && i.path);
  const when = typeof turn.started_at === "number" ? `at ${formatSeconds(turn.started_at)}` : "";
  const took = typeof turn.ended_at === "number" && typeof turn.started_at === "number"
    ? `took ${formatSeconds(turn.ended_at - turn.started_at)}` : "";
  // one level of nesting is flattened: {"usage": {"output_tokens": 7}} -> "output tokens 7"; a count of 0 is left
  // out (the server does not count prompt tokens and reports 0 for them)
  const metrics = Object.entries(turn.metrics || {}).flatMap(([name, value]) => (
    value && typeof value === "object" && !Array.isArray(value) ? Object.entries(value) : [[name, value]]))
    .filter(([name, value]) => !(name.endsWith("_tokens") && !value) && !(value && typeof value === "object"));

  const user = turn.user_text || turn.user_transcript || userClips.length || images.length || videos.length
    ? h("div", { class: "part user" },
      h("div", { class: "who" }, "You"),
      turn.user_text ? h("div", { class: "text" }, turn.user_text) : null,
      turn.user_transcript ? h("div", { class: "text heard", title: "transcribed by the server" },
        h("span", { class: "muted small" }, "Heard: "), `\u201c${turn.user_transcript}\u201d`) : null,
      userClips.map((clip, i) => audioEntry(clip, `Your audio ${i + 1}`)),
      images.map((image) => h("a", { href: fileUrl(image.path) }, h("img", { src: fileUrl(image.path), alt: `Image you sent (${image.path})` }))),
      videos.map((video) => h("video", { class: "sent-video", src: fileUrl(video.path), controls: true, preload: "metadata",
        "aria-label": `Video you sent (${video.path})` })))
    : null;
  const calls = (turn.tool_calls || []).filter((c) => c && typeof c.name === "string");
  const assistant = h("div", { class: "part assistant" },
    h("div", { class: "who" }, "Assistant"),
    h("div", { class: "text" }, turn.assistant_text
      || (aiClips.length || drawn.length || calls.length ? "" : "(no answer recorded)")),
    calls.map(toolCall),
    aiClips.map((clip, i) => audioEntry(clip, `Spoken answer ${i + 1}`)),
    drawn.map(drawnImage));

  return h("li", { class: "turn", "data-turn": turn.index ?? "" },
    h("div", { class: "turn-head" },
      h("h3", {}, `Turn ${turn.index ?? ""}`), badge(turn.status),
      h("span", { class: "muted small" }, [when, took].filter(Boolean).join(" · "))),
    user,
    assistant,
    turn.error ? h("p", { class: "notice error small" }, turn.error) : null,
    metrics.length ? h("div", { class: "metrics", "aria-label": "Metrics" },
      metrics.map(([name, value]) => h("span", { title: name }, `${metricLabel(name)} ${metricValue(name, value)}`))) : null);
}

function render(data) {
  const recording = data.recording || {};
  const turns = Array.isArray(recording.turns) ? recording.turns : [];
  renderMeta(data);
  renderReplay(data);
  els.turnCount.textContent = `${turns.length} turn${turns.length === 1 ? "" : "s"}`;
  setChildren(els.turns, turns.length ? turns.map(renderTurn) : h("li", { class: "empty" }, "No turns were recorded."));
  setChildren(els.files, (data.files || []).map((path) => h("li", {}, h("a", { href: fileUrl(path) }, path))));
  els.raw.textContent = JSON.stringify({ meta: data.meta, events: recording.events || [] }, null, 2);

  const problems = Array.isArray(data.errors) ? data.errors : [];
  if (problems.length) showMessage("warn", "Part of this recording could not be read.", problems.join(" "));
  else if ((data.meta || {}).status === "recording") showMessage("", "", "This session is still running; the page updates by itself.");
  else els.message.classList.add("hidden");
  els.content.classList.remove("hidden");
  els.download.classList.toggle("hidden", SHARED);
}

// ------------------------------------------------------------------------------------------- loading
async function load() {
  let data;
  try {
    data = await fetchJSON(API);
  } catch (error) {
    if (lastPayload) return; // keep what is shown; try again on the next tick
    const home = h("p", {}, h("a", { href: "/" }, "Back to the start page"));
    if (SHARED && error instanceof ApiError && [404, 410].includes(error.status)) {
      showMessage("error", "This share link no longer works", describeError(error), home);
    } else if (error instanceof ApiError && error.status === 404) {
      showMessage("error", "Session not found",
        `There is no recorded session "${sessionId}". The link may be wrong, or the recording was deleted by the retention cleanup.`, home);
    } else if (error instanceof ApiError && error.status === 400) {
      showMessage("error", "Invalid session id", describeError(error), home);
    } else {
      showMessage("error", "Cannot load the session", describeError(error), home);
    }
    return;
  }
  const payload = JSON.stringify(data);
  const playing = [...document.querySelectorAll("audio, video")].some((a) => !a.paused);
  if (payload !== lastPayload && !playing) {
    lastPayload = payload;
    render(data);
  }
  if ((data.meta || {}).status === "recording") setTimeout(load, LIVE_REFRESH_MS);
}

els.id.textContent = SHARED ? "(shared, read-only)" : sessionId;
document.title = SHARED ? "Shared session · omnipipe" : `Session ${sessionId} · omnipipe`;
if (SHARED) {
  load();
} else if (!SESSION_ID.test(sessionId)) {
  showMessage("error", "Invalid session id",
    "Session ids are 1 to 128 letters, digits, '_' or '-'. Check the link.", h("p", {}, h("a", { href: "/" }, "Back to the start page")));
} else {
  els.download.href = `/api/sessions/${encodeURIComponent(sessionId)}/download`;
  els.download.setAttribute("download", `${sessionId}.zip`);
  load();
}
