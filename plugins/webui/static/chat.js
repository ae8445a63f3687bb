// The chat page: a model picker, streaming answers from /v1/chat/completions, a stop button.
"use strict";

(() => {
  const log = document.getElementById("chat-log");
  const form = document.getElementById("chat-form");
  const input = document.getElementById("chat-input");
  const picker = document.getElementById("chat-model");
  const sendButton = document.getElementById("chat-send");
  const stopButton = document.getElementById("chat-stop");
  let messages = [];
  let controller = null;

  // Favourites first, hidden models left out; the current choice is kept.
  async function fillPicker() {
    let names = [];
    try {
      const data = await Tessera.api("/api/models");
      const rows = data.models.filter((m) => !m.hidden);
      rows.sort((a, b) => (b.favourite - a.favourite) || a.name.localeCompare(b.name));
      names = rows.map((m) => [m.name, (m.favourite ? "\u2605 " : "") + m.name +
        (m.state === "loaded" ? " (loaded)" : "")]);
    } catch (e) {
      Tessera.status(e.message);
      return;
    }
    const current = picker.value;
    const key = JSON.stringify(names);
    if (picker.dataset.key === key) return;
    picker.dataset.key = key;
    picker.replaceChildren(...names.map(([value, label]) => new Option(label, value)));
    if (names.some(([value]) => value === current)) picker.value = current;
  }

  function bubble(role, text) {
    const div = document.createElement("div");
    div.className = "msg " + role;
    div.textContent = text;
    log.appendChild(div);
    log.scrollTop = log.scrollHeight;
    return div;
  }

  function setBusy(busy) {
    sendButton.disabled = busy;
    stopButton.disabled = !busy;
  }

  // Reads the SSE stream; each "data:" line is one chunk of the answer.
  async function stream(response, out) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let text = "";
    let chunks = 0;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, cut).trim();
        buffer = buffer.slice(cut + 1);
        if (!line.startsWith("data:")) continue;
        const payload = line.slice(5).trim();
        if (payload === "[DONE]") return text;
        const chunk = JSON.parse(payload);
        if (chunk.error) throw new Error(chunk.error.message);
        const choice = chunk.choices && chunk.choices[0];
        if (!choice) continue;
        const piece = (choice.delta && choice.delta.content) || "";
        if (piece) {
          text += piece;
          chunks += 1;
          out.firstChild.textContent = text;
          out.dataset.chunks = String(chunks);
          log.scrollTop = log.scrollHeight;
        }
        if (choice.finish_reason) out.dataset.finish = choice.finish_reason;
      }
    }
    return text;
  }

  async function send() {
    const content = input.value.trim();
    if (!content || controller) return;
    if (!picker.value) {
      Tessera.status("no model to chat with; add one on the Models page");
      return;
    }
    Tessera.status("");
    input.value = "";
    messages.push({ role: "user", content });
    bubble("user", content);
    const out = bubble("assistant", "");
    out.appendChild(document.createTextNode(""));
    out.dataset.state = "streaming";
    controller = new AbortController();
    setBusy(true);
    const body = {
      model: picker.value,
      messages,
      stream: true,
      temperature: Number(document.getElementById("chat-temp").value),
      max_tokens: Number(document.getElementById("chat-max-tokens").value),
    };
    let text = "";
    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: Tessera.headers({ "Content-Type": "application/json" }),
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (!response.ok) {
        const data = await response.json().catch(() => null);
        throw new Error(data && data.error ? data.error.message : response.statusText);
      }
      text = await stream(response, out);
      out.dataset.state = "done";
    } catch (e) {
      text = out.firstChild.textContent;
      if (e.name === "AbortError") {
        out.dataset.state = "stopped";
      } else {
        out.dataset.state = "error";
        out.classList.add("error");
        out.firstChild.textContent = text + (text ? "\n" : "") + e.message;
      }
    } finally {
      controller = null;
      setBusy(false);
    }
    if (text) messages.push({ role: "assistant", content: text });
    const meta = document.createElement("span");
    meta.className = "meta";
    meta.textContent = body.model + (out.dataset.state === "stopped" ? " \u00b7 stopped" : "");
    out.appendChild(meta);
    fillPicker();
  }

  form.addEventListener("submit", (e) => { e.preventDefault(); send(); });
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); }
  });
  stopButton.addEventListener("click", () => { if (controller) controller.abort(); });
  document.getElementById("chat-clear").addEventListener("click", () => {
    if (controller) controller.abort();
    messages = [];
    log.replaceChildren();
  });
  document.addEventListener("tessera:page", (e) => { if (e.detail === "chat") fillPicker(); });
  document.addEventListener("tessera:refresh", fillPicker);
})();
