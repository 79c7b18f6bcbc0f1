// Admin page: every /api/admin route with the token from the form (kept in sessionStorage for this tab).

import { ApiError, describeError, fetchJSON } from "./api.js";
import { $, formatBytes, formatSeconds, formatTime, h, setChildren } from "./dom.js";

const TOKEN_KEY = "omnipipe.adminToken";
const REFRESH_MS = 4000;

const els = {
  message: $("#auth-message"),
  form: $("#token-form"),
  token: $("#token"),
  signedIn: $("#signed-in"),
  signOut: $("#sign-out"),
  refresh: $("#refresh"),
  autoRefresh: $("#auto-refresh"),
  content: $("#admin-content"),
  updated: $("#updated"),
  workers: $("#workers"),
  queue: $("#queue"),
  running: $("#running"),
  recordings: $("#recordings"),
  recordingsCount: $("#recordings-count"),
  shares: $("#shares"),
  sharesCount: $("#shares-count"),
  etaForm: $("#eta-form"),
  etaFields: $("#eta-fields"),
  etaStatus: $("#eta-status"),
  apps: $("#apps"),
  appsStatus: $("#apps-status"),
  cleanup: $("#cleanup"),
  cleanupReport: $("#cleanup-report"),
};

let token = sessionStorage.getItem(TOKEN_KEY) || "";
let timer = null;

// ------------------------------------------------------------------------------------------- requests
function admin(path, options = {}) {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  return fetchJSON(`/api/admin/${path}`, { ...options, headers });
}

/** Run an admin request; a 401 signs out with the reason. Returns undefined after a 401. */
async function guarded(fn) {
  try {
    return await fn();
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      signOut(error);
      return undefined;
    }
    throw error;
  }
}

// ------------------------------------------------------------------------------------------- auth
function showMessage(kind, title, text) {
  if (!title) {
    els.message.classList.add("hidden");
    return;
  }
  els.message.className = `notice ${kind}`;
  setChildren(els.message, h("strong", {}, title), text ? h("span", {}, text) : null);
}

function explain401(error) {
  if (error.code === "admin_disabled") {
    return ["warn", "Admin API disabled", `${error.message}. Restart the gateway with --admin-token TOKEN to use this page.`];
  }
  if (error.code === "admin_token_invalid" || token) {
    return ["error", "Admin token refused", `The gateway did not accept this token (${error.message}). Check it and try again.`];
  }
  return ["warn", "Admin token required", "Enter the gateway's admin token to see and manage workers, the queue and recordings."];
}

function signOut(error = null) {
  const [kind, title, text] = error ? explain401(error) : ["warn", "Admin token required", "Enter the admin token to continue."];
  token = "";
  sessionStorage.removeItem(TOKEN_KEY);
  clearInterval(timer);
  timer = null;
  els.content.classList.add("hidden");
  els.signedIn.classList.add("hidden");
  els.form.classList.remove("hidden");
  showMessage(kind, title, text);
  els.token.focus();
}

function signedIn() {
  showMessage();
  els.form.classList.add("hidden");
  els.signedIn.classList.remove("hidden");
  els.content.classList.remove("hidden");
  loadSettings();
  refresh();
  clearInterval(timer);
  timer = setInterval(() => {
    if (els.autoRefresh.checked && !document.hidden) refresh();
  }, REFRESH_MS);
}

/** Check the token (or its absence) with one cheap admin call. */
async function probe(candidate) {
  token = candidate;
  try {
    await admin("workers");
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      signOut(error);
      return false;
    }
    showMessage("error", "Cannot reach the gateway", describeError(error));
    return false;
  }
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  signedIn();
  return true;
}

// ------------------------------------------------------------------------------------------- tables
function table(columns, rows, emptyText) {
  if (!rows.length) return h("p", { class: "empty" }, emptyText);
  return h("table", { class: "data" },
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col", class: c.num ? "num" : null }, c.label)))),
    h("tbody", {}, rows.map((row) => h("tr", {}, columns.map((c) => h("td", { class: c.num ? "num" : null }, c.cell(row)))))));
}

function stateBadge(state) {
  const name = String(state || "unknown").toLowerCase();
  const kind = { idle: "ok", busy: "accent", duplex_active: "accent", duplex_paused: "warn", loading: "warn",
    error: "danger", offline: "danger", completed: "ok", recording: "accent", cancelled: "warn", failed: "danger" }[name] || "";
  return h("span", { class: `badge ${kind}` }, name.replace("_", " "));
}

const sessionLink = (id) => h("a", { href: `/s/${encodeURIComponent(id)}`, class: "mono" }, id);

function ago(epochSeconds) {
  if (!epochSeconds) return "—";
  return formatSeconds(Date.now() / 1000 - epochSeconds, 0);
}

function renderWorkers(workers) {
  setChildren(els.workers, table([
    { label: "Address", cell: (w) => h("span", { class: "mono" }, w.address) },
    { label: "State", cell: (w) => stateBadge(w.state) },
    { label: "Online", cell: (w) => (w.online ? "yes" : "no") },
    { label: "Active / capacity", num: true, cell: (w) => `${w.active_sessions} / ${w.capacity}` },
    { label: "Last answered", num: true, cell: (w) => (w.last_ok_s_ago === null || w.last_ok_s_ago === undefined ? "never" : `${formatSeconds(w.last_ok_s_ago)} ago`) },
    { label: "Note", cell: (w) => w.reason || "" },
  ], workers, "No workers configured."));
}

/** A waiter's estimate; none while the workers are loading or while no worker is available. */
function estimatedWait(ticket) {
  if (ticket.starting) return "starting (models loading)";
  if (ticket.estimated_wait_s === null || ticket.estimated_wait_s === undefined) return "no worker available";
  return formatSeconds(ticket.estimated_wait_s);
}

function renderQueue(tickets) {
  setChildren(els.queue, table([
    { label: "#", num: true, cell: (t) => String(t.position) },
    { label: "Type", cell: (t) => t.request_type },
    { label: "Ticket", cell: (t) => h("span", { class: "mono small" }, t.ticket_id) },
    { label: "Waiting", num: true, cell: (t) => formatSeconds(t.waited_s) },
    { label: "Estimated wait", num: true, cell: (t) => estimatedWait(t) },
    { label: "", cell: (t) => h("button", { type: "button", class: "btn small danger", "aria-label": `Cancel ticket ${t.ticket_id}`, onclick: () => cancelTicket(t.ticket_id) }, "Cancel") },
  ], tickets, "Nobody is waiting."));
}

function renderRunning(sessions) {
  setChildren(els.running, table([
    // a link only where a recording is being made (not with --no-record)
    { label: "Session", cell: (s) => (s.recording === false ? h("span", { class: "mono" }, s.session_id) : sessionLink(s.session_id)) },
    { label: "Type", cell: (s) => s.type },
    { label: "Worker", cell: (s) => h("span", { class: "mono" }, s.worker || "—") },
    { label: "Running for", num: true, cell: (s) => ago(s.started_at) },
    { label: "Client", cell: (s) => s.client || "—" },
  ], sessions, "No session is running."));
}

function renderRecordings(recordings) {
  const shown = recordings.slice(0, 200);
  els.recordingsCount.textContent = recordings.length > shown.length
    ? `newest ${shown.length} of ${recordings.length}` : `${recordings.length} in total`;
  setChildren(els.recordings, table([
    { label: "Session", cell: (r) => sessionLink(r.session_id) },
    { label: "Type", cell: (r) => r.type },
    { label: "Started", cell: (r) => formatTime(r.created_at) },
    { label: "Duration", num: true, cell: (r) => (r.ended_at ? formatSeconds(r.ended_at - r.created_at) : "—") },
    { label: "Status", cell: (r) => stateBadge(r.status) },
    { label: "Size", num: true, cell: (r) => formatBytes(r.size_bytes) },
  ], shown, "No recordings yet."));
}

/** Share links (/shared/{token}): the session each opens, and a Revoke button while it works. */
function renderShares(shares) {
  const active = shares.filter((s) => s.status === "active").length;
  els.sharesCount.textContent = `${active} active of ${shares.length}`;
  setChildren(els.shares, table([
    { label: "Share", cell: (s) => h("span", { class: "mono small" }, s.share_id) },
    { label: "Session", cell: (s) => sessionLink(s.session_id) },
    { label: "Made", cell: (s) => formatTime(s.created_at) },
    { label: "Status", cell: (s) => (s.revoked_at ? h("span", { class: "badge warn", title: `revoked ${formatTime(s.revoked_at)}` }, "revoked")
      : h("span", { class: "badge ok" }, "active")) },
    { label: "", cell: (s) => (s.revoked_at ? "" : h("button", { type: "button", class: "btn small danger",
      "aria-label": `Revoke share ${s.share_id}`, onclick: () => revokeShare(s.share_id) }, "Revoke")) },
  ], shares, "No session has been shared."));
}

async function revokeShare(shareId) {
  try {
    await guarded(() => admin(`shares/${encodeURIComponent(shareId)}`, { method: "DELETE" }));
  } catch (error) {
    els.updated.textContent = `Revoking failed: ${describeError(error)}`;
  }
  refresh();
}

async function refresh() {
  try {
    const results = await guarded(() => Promise.all([admin("workers"), admin("queue"), admin("sessions"), admin("recordings"),
      admin("shares")]));
    if (!results) return;
    const [workers, queue, running, recordings, shares] = results;
    renderWorkers(workers);
    renderQueue(queue);
    renderRunning(running);
    renderRecordings(recordings);
    renderShares(shares);
    els.updated.textContent = `Updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    els.updated.textContent = `Refresh failed: ${describeError(error)}`;
  }
}

async function cancelTicket(ticketId) {
  try {
    await guarded(() => admin(`queue/${encodeURIComponent(ticketId)}`, { method: "DELETE" }));
  } catch (error) {
    els.updated.textContent = error.status === 404 ? "That request had already left the queue." : describeError(error);
  }
  refresh();
}

// ------------------------------------------------------------------------------------------- settings
/** GET /api/admin/eta answers {type: {baseline_s, samples, ema_s, duration_s}}; older shapes {baselines: {...}}. */
function etaEntries(snapshot) {
  if (snapshot && snapshot.baselines && typeof snapshot.baselines === "object") {
    return Object.entries(snapshot.baselines).map(([name, seconds]) => [name, { baseline_s: seconds }]);
  }
  return Object.entries(snapshot || {}).filter(([, v]) => v && typeof v === "object");
}

function renderEta(snapshot) {
  setChildren(els.etaFields, etaEntries(snapshot).map(([name, info]) => {
    const id = `eta-${name}`;
    const sessions = (n) => `${n} session${n === 1 ? "" : "s"}`;
    const needed = info.min_samples ?? 5;
    const measured = info.measured
      ? `Not used now: waits use the measured average, ${formatSeconds(info.duration_s)} (${sessions(info.samples)}).`
      : `In use: ${sessions(info.samples || 0)} measured so far; the average replaces this after ${needed}.`;
    return h("div", { class: "field" },
      h("label", { for: id }, name),
      h("input", { type: "number", id, name, min: "0", step: "any", required: true, value: info.baseline_s ?? "" }),
      h("span", { class: "hint" }, measured));
  }));
}

function renderApps(apps) {
  setChildren(els.apps, Object.entries(apps).map(([name, enabled]) => {
    const id = `app-${name}`;
    return h("label", { class: "switch", for: id },
      h("input", { type: "checkbox", id, role: "switch", checked: enabled, onchange: (e) => setApp(name, e.target) }), name);
  }));
}

async function loadSettings() {
  try {
    const [eta, apps] = (await guarded(() => Promise.all([admin("eta"), admin("apps")]))) || [];
    if (eta) renderEta(eta);
    if (apps) renderApps(apps);
  } catch (error) {
    els.etaStatus.textContent = describeError(error);
  }
}

async function saveEta(event) {
  event.preventDefault();
  const baselines = {};
  for (const input of els.etaFields.querySelectorAll("input")) baselines[input.name] = Number(input.value);
  els.etaStatus.textContent = "Saving…";
  try {
    const snapshot = await guarded(() => admin("eta", { method: "PUT", body: { baselines } }));
    if (!snapshot) return;
    renderEta(snapshot);
    els.etaStatus.textContent = `Saved at ${new Date().toLocaleTimeString()}.`;
  } catch (error) {
    els.etaStatus.textContent = `Not saved: ${describeError(error)}`;
  }
}

async function setApp(name, input) {
  const wanted = input.checked;
  els.appsStatus.textContent = "Saving…";
  try {
    const apps = await guarded(() => admin("apps", { method: "PUT", body: { [name]: wanted } }));
    if (!apps) return;
    renderApps(apps);
    els.appsStatus.textContent = `${name} ${wanted ? "enabled" : "disabled"}.`;
  } catch (error) {
    input.checked = !wanted;
    els.appsStatus.textContent = `Not saved: ${describeError(error)}`;
  }
}

async function runCleanup() {
  els.cleanup.disabled = true;
  setChildren(els.cleanupReport, h("p", { class: "muted small", role: "status" }, "Cleaning up…"));
  try {
    const report = await guarded(() => admin("cleanup", { method: "POST" }));
    if (!report) return;
    const deleted = (report.deleted_by_age ?? 0) + (report.deleted_by_size ?? 0);
    const summary = `Scanned ${report.scanned ?? "?"} session(s); deleted ${deleted} (${report.deleted_by_age ?? 0} too old, `
      + `${report.deleted_by_size ?? 0} over the storage limit), freed ${formatBytes(report.freed_bytes)}; `
      + `${report.remaining ?? "?"} left using ${formatBytes(report.remaining_bytes)}.`;
    const errors = Array.isArray(report.errors) ? report.errors : [];
    setChildren(els.cleanupReport,
      h("div", { class: `notice ${errors.length ? "warn" : "ok"}`, role: "status", style: "margin-top: 0.75rem" }, summary,
        errors.length ? h("ul", {}, errors.map((e) => h("li", {}, e))) : null),
      h("details", {}, h("summary", {}, "Full report"), h("pre", { class: "report" }, JSON.stringify(report, null, 2))));
    refresh();
  } catch (error) {
    setChildren(els.cleanupReport, h("div", { class: "notice error", role: "alert" }, `Cleanup failed: ${describeError(error)}`));
  } finally {
    els.cleanup.disabled = false;
  }
}

// ------------------------------------------------------------------------------------------- wiring
els.form.addEventListener("submit", (event) => {
  event.preventDefault();
  const candidate = els.token.value.trim();
  if (!candidate) {
    showMessage("warn", "Admin token required", "Enter the token first.");
    return;
  }
  probe(candidate).then((ok) => { if (ok) els.token.value = ""; });
});
els.signOut.addEventListener("click", () => signOut());
els.refresh.addEventListener("click", () => { refresh(); loadSettings(); });
els.etaForm.addEventListener("submit", saveEta);
els.cleanup.addEventListener("click", runCleanup);
probe(token);
