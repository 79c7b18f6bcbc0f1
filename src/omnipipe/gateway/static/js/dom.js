// Small DOM helpers. Text from the server is always set as text (never as HTML).

/**
 * Make an element: h("a", {href: "/chat", class: "btn"}, "Chat").
 * Attributes: `class`, `text`, `dataset` (object), `on<event>` (function), booleans (true -> present),
 * anything else via setAttribute. Children: strings, nodes, arrays, null/undefined/false (skipped).
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (value === true) el.setAttribute(key, "");
    else el.setAttribute(key, String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : String(child));
  }
}

export const $ = (selector, root = document) => root.querySelector(selector);

/** Replace the children of `el`. */
export function setChildren(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

/** "3.2 s", "1 min 05 s"; "—" for missing values. */
export function formatSeconds(seconds, digits = 1) {
  if (seconds === undefined || seconds === null || !Number.isFinite(Number(seconds))) return "—";
  const s = Number(seconds);
  if (s < 60) return `${s.toFixed(digits)} s`;
  const minutes = Math.floor(s / 60);
  const rest = Math.round(s - minutes * 60);
  if (minutes < 60) return `${minutes} min ${String(rest).padStart(2, "0")} s`;
  return `${Math.floor(minutes / 60)} h ${String(minutes % 60).padStart(2, "0")} min`;
}

/** A rough wait: "about 30 s", "about 2 min". */
export function formatWait(seconds) {
  if (seconds === undefined || seconds === null || !Number.isFinite(Number(seconds))) return "unknown";
  const s = Math.max(0, Number(seconds));
  if (s < 1) return "less than a second";
  if (s < 90) return `about ${Math.round(s)} s`;
  return `about ${Math.round(s / 60)} min`;
}

export function formatBytes(bytes) {
  if (bytes === undefined || bytes === null || !Number.isFinite(Number(bytes))) return "—";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let value = Number(bytes);
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}

/** A timestamp (epoch seconds, epoch ms or ISO string) as local date and time. */
export function formatTime(value) {
  if (value === undefined || value === null || value === "") return "—";
  let date;
  if (typeof value === "number") date = new Date(value > 1e12 ? value : value * 1000);
  else date = new Date(value);
  if (Number.isNaN(date.getTime())) return String(value);
  return date.toLocaleString();
}
