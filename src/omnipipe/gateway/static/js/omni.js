// Omni page: the voice page's live spoken session (duplex-page.js) with the camera. While the session is live and
// not paused, a frame is taken from the camera preview every 1 / fps seconds (0.5, 1 or 2 per second), sent as
// `input_video_frame.append` {image: JPEG data URL, captured_at_ms: performance.now()} and shown on the strip of
// frames sent. When the server makes a user item (the end of a spoken question), the frames that went with it are
// listed in the item's `input_image` parts by their capture time; the strip marks them. Offered only when the
// served model takes images or video (omni-offer.js).

import { servedModel } from "./api.js";
import { Camera } from "./camera.js";
import { $, h } from "./dom.js";
import { sendEvent, sessionTime, showError, startDuplexPage } from "./duplex-page.js";
import { FrameStrip } from "./frame-strip.js";
import { seesFrames } from "./omni-offer.js";

const MIRROR_KEY = "omnipipe.omni.mirror";
const FPS_KEY = "omnipipe.omni.fps";
const STRIP_PLACEHOLDER = "The frames sent to the model show here.";
const MAX_FRAMES_LOGGED = 2000; // hooks.framesSent keeps the last ones (as hooks.events does)

const els = {
  video: $("#camera-preview"),
  cameraSelect: $("#camera-select"),
  mirror: $("#mirror"),
  fps: $("#frame-rate"),
  strip: $("#frame-strip"),
  unsupported: $("#unsupported"),
  start: $("#start"),
};
const camera = new Camera(els.video);
const strip = new FrameStrip(els.strip);
let timer = null;

const hooks = startDuplexPage({
  hooksName: "omnipipeOmni",
  presetKey: "omni",
  labels: {
    idle: ["Ready", "Press Start, then talk about what the camera shows."],
    microphone: ["Camera and microphone…", "Allow the camera and the microphone to start the session."],
    listening: ["Listening", "Ask about what the camera shows; the model answers when you pause."],
  },
  openInputs,
  closeInputs,
  onSendingChange,
  handlers: { "conversation.item.added": markFramesUsed },
});
hooks.framesSent = []; // the last frames sent: [{captured_at_ms, chars (of the data URL), width, height, t_ms}]
hooks.framesUsed = []; // per user item: {item_id, captured_at_ms: [...], shown (how many were still on the strip)}

// ------------------------------------------------------------------------------------------- the camera
async function openInputs() {
  await camera.start(els.cameraSelect.value);
  strip.clear(STRIP_PLACEHOLDER);
  await listCameras();
}

function closeInputs() {
  clearInterval(timer);
  timer = null;
  camera.stop();
}

/** Fill the camera choice with the browser's cameras, the one in use selected. */
async function listCameras() {
  const cameras = await camera.cameras();
  const current = camera.deviceId;
  els.cameraSelect.replaceChildren(...cameras.map((c) => h("option", { value: c.deviceId }, c.label)));
  if (current) els.cameraSelect.value = current;
  els.cameraSelect.disabled = cameras.length < 2;
}

async function switchCamera() {
  if (!camera.active) return;
  try {
    await camera.start(els.cameraSelect.value);
  } catch (error) {
    showError(error.message);
  }
}

// ------------------------------------------------------------------------------------------- the frames
function framesPerSecond() {
  return Number(els.fps.value) || 1;
}

/** Frames go while input goes to the server (live, not paused): one now, then one every 1 / fps seconds. */
function onSendingChange(sending) {
  clearInterval(timer);
  timer = null;
  if (!sending) return;
  sendFrame();
  restartTimer();
}

function restartTimer() {
  clearInterval(timer);
  timer = setInterval(sendFrame, 1000 / framesPerSecond());
}

function sendFrame() {
  const capturedAt = Math.round(performance.now() * 10) / 10;
  const frame = camera.grab();
  if (!frame) return; // no picture yet
  sendEvent({ type: "input_video_frame.append", image: frame.url, captured_at_ms: capturedAt });
  const tMs = sessionTime(capturedAt);
  hooks.framesSent.push({ captured_at_ms: capturedAt, chars: frame.url.length, width: frame.width,
    height: frame.height, t_ms: tMs });
  const over = hooks.framesSent.length - MAX_FRAMES_LOGGED;
  if (over > 0) hooks.framesSent.splice(0, over);
  strip.add(frame.url, capturedAt, `${(tMs / 1000).toFixed(1)} s`);
}

function markFramesUsed(event) {
  const item = event.item || {};
  if (item.role !== "user") return;
  const used = (item.content || []).filter((part) => part.type === "input_image").map((part) => part.captured_at_ms);
  if (!used.length) return;
  hooks.framesUsed.push({ item_id: item.id ?? null, captured_at_ms: used, shown: strip.markUsed(used) });
}

// ------------------------------------------------------------------------------------------- settings
function applyMirror() {
  els.video.classList.toggle("mirrored", els.mirror.checked);
}

/** Offer the session only when the served model sees images or video; say why not otherwise. */
async function showCapabilities() {
  const model = await servedModel();
  const sees = seesFrames(model);
  els.unsupported.classList.toggle("hidden", sees);
  els.start.classList.toggle("hidden", !sees);
  document.body.dataset.capabilities = "known";
}

els.mirror.checked = localStorage.getItem(MIRROR_KEY) !== "0";
els.fps.value = localStorage.getItem(FPS_KEY) || "1";
if (!els.fps.value) els.fps.value = "1"; // a stored rate no longer offered
applyMirror();
els.mirror.addEventListener("change", () => {
  localStorage.setItem(MIRROR_KEY, els.mirror.checked ? "1" : "0");
  applyMirror();
});
els.fps.addEventListener("change", () => {
  localStorage.setItem(FPS_KEY, els.fps.value);
  if (timer !== null) restartTimer();
});
els.cameraSelect.addEventListener("change", switchCamera);
showCapabilities();
