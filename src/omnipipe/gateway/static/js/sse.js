// Server-sent events over fetch(): EventSource cannot POST or send headers, so the pages parse the stream here.

/**
 * Read a fetch Response body as server-sent events. Yields {event, data, id} for each event that has data
 * (`event` is "message" unless the server named it). Comment lines (": ...") are skipped.
 * Lines may end in "\n", "\r\n" or "\r", and may be split anywhere between network reads.
 */
export async function* readSSE(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let eventName = "";
  let dataLines = [];
  let lastId = null;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      // A "\r" at the very end may be the first half of "\r\n": wait for the next piece.
      const keep = buffer.endsWith("\r") ? 1 : 0;
      const complete = buffer.slice(0, buffer.length - keep);
      const lines = complete.split(/\r\n|\r|\n/);
      buffer = lines.pop() + buffer.slice(buffer.length - keep);
      for (const line of lines) {
        if (line === "") {
          if (dataLines.length) yield { event: eventName || "message", data: dataLines.join("\n"), id: lastId };
          eventName = "";
          dataLines = [];
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon === -1 ? line : line.slice(0, colon);
        let value = colon === -1 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "data") dataLines.push(value);
        else if (field === "event") eventName = value;
        else if (field === "id") lastId = value;
      }
    }
    // as the SSE standard says, an event the stream ends in the middle of (no blank line yet) is dropped
  } finally {
    // the caller may stop early (e.g. at "[DONE]"): let go of the connection
    await reader.cancel().catch(() => {});
  }
}
