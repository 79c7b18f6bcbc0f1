// Talking to the gateway's JSON routes, with errors turned into readable messages.

/** An HTTP answer that was not 2xx: `status`, `code` (OpenAI error code, if any) and the server's message. */
export class ApiError extends Error {
  constructor(status, message, { code = null, type = null, param = null, retryAfter = null, body = null } = {}) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
    this.type = type;
    this.param = param;
    this.retryAfter = retryAfter;
    this.body = body;
  }
}

/** The message inside an error body: OpenAI style `{error: {message}}`, FastAPI `{detail}`, or plain text. */
export function errorMessage(body, fallback) {
  if (body && typeof body === "object") {
    const err = body.error;
    if (err && typeof err === "object" && err.message) return String(err.message);
    if (typeof err === "string") return err;
    if (typeof body.detail === "string") return body.detail;
    if (Array.isArray(body.detail)) {
      return body.detail.map((d) => (d && d.msg ? `${(d.loc || []).join(".")}: ${d.msg}` : JSON.stringify(d))).join("; ");
    }
    if (typeof body.message === "string") return body.message;
  }
  if (typeof body === "string" && body.trim()) return body.trim().slice(0, 500);
  return fallback;
}

/** Build an ApiError from a non-2xx Response (reads its body). */
export async function apiErrorFrom(response) {
  const text = await response.text().catch(() => "");
  let body = text;
  try { body = JSON.parse(text); } catch { /* not JSON */ }
  const err = body && typeof body === "object" && typeof body.error === "object" ? body.error : {};
  const retry = response.headers.get("Retry-After");
  return new ApiError(response.status, errorMessage(body, `${response.status} ${response.statusText || "error"}`), {
    code: err.code ?? null,
    type: err.type ?? null,
    param: err.param ?? null,
    retryAfter: retry !== null && retry !== "" ? Number(retry) : null,
    body,
  });
}

/** fetch + JSON. Non-2xx answers throw ApiError; network failures throw ApiError with status 0. */
export async function fetchJSON(url, { method = "GET", body, headers = {}, signal } = {}) {
  const init = { method, headers: { Accept: "application/json", ...headers }, signal };
  if (body !== undefined) {
    init.body = typeof body === "string" ? body : JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, `Cannot reach the gateway (${error.message}).`);
  }
  if (!response.ok) throw await apiErrorFrom(response);
  if (response.status === 204) return null;
  const text = await response.text();
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/** A one-line description for the page, e.g. "Queue is full (HTTP 503, queue_full). Try again in 5 s." */
export function describeError(error) {
  if (!(error instanceof ApiError)) return error && error.message ? error.message : String(error);
  const parts = [error.message];
  const tags = [];
  if (error.status) tags.push(`HTTP ${error.status}`);
  if (error.code) tags.push(error.code);
  if (tags.length) parts[0] += ` (${tags.join(", ")})`;
  if (error.retryAfter) parts.push(`Try again in ${error.retryAfter} s.`);
  return parts.join(" ");
}

/** The model id to send: the first one /v1/models lists (the worker's main pipeline), else "default". */
let modelPromise = null;
export function defaultModel() {
  if (!modelPromise) {
    modelPromise = fetchJSON("/v1/models")
      .then((list) => (list && Array.isArray(list.data) && list.data.length ? list.data[0].id : "default"))
      .catch(() => "default");
  }
  return modelPromise;
}
