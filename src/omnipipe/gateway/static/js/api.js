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

/** What people read for the error codes the gateway and the workers answer with. */
const CODE_WORDS = {
  queue_full: "Too many people are waiting right now, so the queue is full.",
  queue_cancelled: "Your place in the queue was cancelled.",
  worker_failed: "The server answering you stopped working before the answer was complete.",
  worker_at_capacity: "Every server is busy right now.",
  no_worker: "No server is available right now.",
  engine_loading: "The model is still loading.",
  engine_failed: "The model could not be started on the server.",
  app_disabled: "This app has been turned off by the administrator.",
  body_too_large: "What you sent is too large.",
  internal_error: "Something went wrong on the server.",
};

function sentence(text) {
  const trimmed = String(text || "").trim();
  if (!trimmed) return "";
  // a message that starts with the field it names ("captured_at_ms: ...") keeps the field's spelling
  const named = /^[a-z_][\w.[\]]*: /.test(trimmed);
  const capital = named ? trimmed : trimmed[0].toUpperCase() + trimmed.slice(1);
  return /[.!?…]$/.test(capital) ? capital : `${capital}.`;
}

/** One or two plain sentences for the page, e.g. "Too many people are waiting right now, so the queue is full.
 * Try again in 5 s." The server's message is used where no wording is known for its code; status numbers and
 * codes are left out (they are on `error.status` and `error.code` for whoever needs them). */
export function describeError(error) {
  if (!(error instanceof ApiError)) return sentence(error && error.message ? error.message : String(error));
  let text = CODE_WORDS[error.code];
  if (!text && error.status === 0) text = sentence(error.message) || "Cannot reach the server.";
  if (!text && error.status === 429) text = "Too many requests at once.";
  if (!text && error.status >= 500 && !error.code) text = "Something went wrong on the server.";
  if (!text) text = sentence(error.message) || "The request failed.";
  const parts = [text];
  if (error.retryAfter) parts.push(`Try again in ${error.retryAfter} s.`);
  else if (["queue_full", "worker_at_capacity", "no_worker", "engine_loading", "worker_failed"].includes(error.code)) {
    parts.push("Try again in a moment.");
  }
  return parts.join(" ");
}

/** The model to send and what it takes and gives: the first one /v1/models lists (the worker's main pipeline),
 * `{id, input: [...] | null, output: [...] | null, conversation: bool}` (null: the server did not say; conversation:
 * whether chat takes the earlier turns); `{id: "default"}` when no worker answers. */
let modelPromise = null;
export function servedModel() {
  if (!modelPromise) {
    modelPromise = fetchJSON("/v1/models")
      .then((list) => {
        const card = list && Array.isArray(list.data) && list.data.length ? list.data[0] : null;
        if (!card) return { id: "default", input: null, output: null, conversation: false };
        const modalities = (value) => (Array.isArray(value) ? value.map(String) : null);
        return { id: card.id, input: modalities(card.input_modalities), output: modalities(card.output_modalities),
          conversation: card.conversation === true };
      })
      .catch(() => {
        modelPromise = null; // ask again next time: the workers may be starting
        return { id: "default", input: null, output: null, conversation: false };
      });
  }
  return modelPromise;
}

/** The model id to send. */
export async function defaultModel() {
  return (await servedModel()).id;
}
