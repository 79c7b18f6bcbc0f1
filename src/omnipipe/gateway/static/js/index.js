// Home page: live queue and worker status from GET /api/queue, and the omni page's link when the served model
// takes images or video.

import { describeError, fetchJSON } from "./api.js";
import { $ } from "./dom.js";
import { omniOffered } from "./omni-offer.js";

const REFRESH_MS = 5000;

async function refresh() {
  const error = $("#status-error");
  try {
    const status = await fetchJSON("/api/queue");
    const workers = status.workers || {};
    $("#stat-workers").textContent = `${workers.available ?? "—"} / ${workers.total ?? "—"}`;
    $("#stat-queue").textContent = String(status.queue_length ?? "—");
    $("#stat-capacity").textContent = String(status.capacity ?? "—");
    $("#status-updated").textContent = `Updated ${new Date().toLocaleTimeString()}`;
    const note = $("#status-note");
    const waitFor = status.starting ? "No worker is ready yet: the service is starting (models loading)."
      : "No worker is ready at the moment.";
    note.textContent = workers.available === 0 ? `${waitFor} Requests wait in the queue until one is.` : "";
    note.classList.toggle("hidden", workers.available !== 0);
    error.classList.add("hidden");
  } catch (err) {
    error.textContent = `Cannot read the queue status: ${describeError(err)}`;
    error.classList.remove("hidden");
  }
}

$("#api-example").textContent = `curl ${window.location.origin}/v1/chat/completions \\
  -H "Content-Type: application/json" \\
  -d '{"model": "default", "messages": [{"role": "user", "content": "What is the capital of France?"}]}'`;

omniOffered().then((offered) => $("#omni-link").classList.toggle("hidden", !offered));
refresh();
setInterval(() => { if (!document.hidden) refresh(); }, REFRESH_MS);
