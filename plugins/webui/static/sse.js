// Server-sent events of an OpenAI stream: yields each "data:" line's JSON chunk, ends at
// "[DONE]" (or when the server closes), throws the server's message for an error chunk.

export async function* sseChunks(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, cut).trim();
      buffer = buffer.slice(cut + 1);
      if (!line.startsWith("data:")) continue;
      const payload = line.slice(5).trim();
      if (payload === "[DONE]") return;
      const chunk = JSON.parse(payload);
      if (chunk.error) throw new Error(chunk.error.message);
      yield chunk;
    }
  }
}
