// The chat page's controller: the open conversation, sending a message, streaming the
// answer from /v1/chat/completions (content and reasoning), stopping it, regenerating
// and editing; every change is saved to the browser's store.

import { errorOf, headers, status } from "./api.js";
import { initAttachments, takeAttachments } from "./attachments.js";
import { copyText, flash } from "./clipboard.js";
import { newConversation, requestBody, titleFrom } from "./conversation.js";
import { editBox, messageElement, updateAssistant } from "./message-view.js";
import { fillPicker, picker, selectModel } from "./model-picker.js";
import { showSettings } from "./settings.js";
import { initSidebar, renderSidebar } from "./sidebar.js";
import { sseChunks } from "./sse.js";
import { getConversation, listConversations, putConversation } from "./store.js";

const log = document.getElementById("chat-log");
const input = document.getElementById("chat-input");
const sendButton = document.getElementById("chat-send");
const stopButton = document.getElementById("chat-stop");
const CURRENT = "tessera.conversation";
let conv = null;
let controller = null;
let saveTimer = null;

function setBusy(busy) {
  sendButton.hidden = busy;
  stopButton.hidden = !busy;
  stopButton.disabled = !busy;
  document.body.classList.toggle("streaming", busy);
}

async function save() {
  clearTimeout(saveTimer);
  conv.updated = Date.now();
  await putConversation(conv);
}

// Settings are saved a moment after the last keystroke, not on each one.
function saveSoon() {
  clearTimeout(saveTimer);
  saveTimer = setTimeout(async () => { await save(); renderSidebar(conv.id); }, 300);
}

function emptyState() {
  const div = document.createElement("div");
  div.className = "empty-chat";
  div.textContent = "Ask anything. Enter sends, Shift+Enter starts a new line; " +
    "Settings holds the system prompt and the samplers of this conversation.";
  return div;
}

function renderLog() {
  log.replaceChildren(...conv.messages.map((m, i) => messageElement(m, i)));
  if (!conv.messages.length) log.appendChild(emptyState());
  log.scrollTop = log.scrollHeight;
}

function nearBottom() {
  return log.scrollHeight - log.scrollTop - log.clientHeight < 80;
}

function show(c) {
  conv = c;
  localStorage.setItem(CURRENT, conv.id);
  if (!selectModel(conv.model) && picker.value && !conv.messages.length) conv.model = picker.value;
  showSettings(conv, saveSoon);
  renderLog();
  renderSidebar(conv.id);
  document.body.classList.remove("sidebar-open");
}

async function open(id) {
  if (controller) controller.abort();  // the answer being written ends here
  const found = id ? await getConversation(id) : null;
  if (!found) return show(newConversation(picker.value, conv ? conv.settings : null));
  // an answer that was streaming when the page went away ended there
  for (const m of found.messages) if (m.state === "streaming") m.state = "stopped";
  show(found);
}

async function generate() {
  const target = conv;
  const m = { role: "assistant", content: "", reasoning: "", model: target.model,
    state: "streaming", chunks: 0 };
  const body = requestBody(target);
  target.messages.push(m);
  const article = messageElement(m, target.messages.length - 1);
  log.querySelector(".empty-chat")?.remove();
  log.appendChild(article);
  log.scrollTop = log.scrollHeight;
  controller = new AbortController();
  setBusy(true);
  await save();
  renderSidebar(target.id);
  let frame = 0;
  let saved = Date.now();
  const paint = () => {
    frame = 0;
    const stick = nearBottom();
    updateAssistant(article, m);
    if (stick) log.scrollTop = log.scrollHeight;
  };
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorOf(response));
    for await (const chunk of sseChunks(response)) {
      if (chunk.usage) m.usage = chunk.usage;
      if (chunk.timings) m.timings = chunk.timings;
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) continue;
      const delta = choice.delta || {};
      if (delta.reasoning_content) { m.reasoning += delta.reasoning_content; m.chunks += 1; }
      if (delta.content) { m.content += delta.content; m.chunks += 1; }
      if (choice.finish_reason) m.finish = choice.finish_reason;
      if (!frame) frame = requestAnimationFrame(paint);
      if (Date.now() - saved > 1000) { saved = Date.now(); putConversation(target); }
    }
    m.state = "done";
  } catch (e) {
    if (e.name === "AbortError") m.state = "stopped";
    else { m.state = "error"; m.error = e.message; }
  } finally {
    controller = null;
    setBusy(false);
  }
  cancelAnimationFrame(frame);
  paint();
  target.updated = Date.now();
  await putConversation(target);
  renderSidebar(conv.id);
  fillPicker();
}

async function send() {
  const text = input.value.trim();
  if (controller) return;
  if (!picker.value) {
    status("no model to chat with; add one on the Models page");
    return;
  }
  const files = takeAttachments();
  if (!text && !files.length) return;
  status("");
  conv.model = picker.value;
  if (!conv.messages.length && conv.title === "New chat") {
    conv.title = titleFrom(text || files[0].name);
  }
  conv.messages.push({ role: "user", content: text, attachments: files });
  input.value = "";
  input.style.height = "";
  log.querySelector(".empty-chat")?.remove();
  log.appendChild(messageElement(conv.messages.at(-1), conv.messages.length - 1));
  await generate();
}

// The message actions: copy its text (or a code block's), edit and resend, regenerate.
async function act(button) {
  const article = button.closest("article.msg");
  const i = Number(article.dataset.index);
  const m = conv.messages[i];
  const action = button.dataset.action;
  if (action === "copy-code") {
    const code = button.closest("pre").querySelector("code");
    if (await copyText(code ? code.textContent : "")) flash(button, "Copied");
    return;
  }
  if (action === "copy") {
    if (await copyText(m.content)) flash(button, "Copied");
    return;
  }
  if (controller) return;  // the history cannot change under an answer being written
  if (action === "regenerate") {
    conv.messages = conv.messages.slice(0, i);
    renderLog();
    await generate();
  }
  if (action === "edit") {
    editBox(article, m, async (text) => {
      if (!text.trim()) return;
      conv.messages = conv.messages.slice(0, i);
      conv.messages.push(Object.assign({}, m, { content: text.trim() }));
      renderLog();
      await generate();
    }, renderLog);
  }
}

export async function initChat() {
  initAttachments((message) => status(message));
  initSidebar({
    onSelect: (id) => open(id),
    onNew: () => open(null),
    onChanged: (c) => { if (c.id === conv.id) conv.title = c.title; },
    onDeleted: async (id) => {
      if (id !== conv.id) return renderSidebar(conv.id);
      const rest = await listConversations();
      return open(rest.length ? rest[0].id : null);
    },
    onImported: (n) => { status(`imported ${n} conversation${n === 1 ? "" : "s"}`, true); renderSidebar(conv.id); },
    onError: (message) => status(message),
  });
  document.getElementById("chat-form").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  input.addEventListener("input", () => {
    input.style.height = "";
    input.style.height = Math.min(input.scrollHeight, window.innerHeight * 0.4) + "px";
  });
  stopButton.addEventListener("click", () => { if (controller) controller.abort(); });
  log.addEventListener("click", (e) => {
    const b = e.target.closest("button[data-action]");
    if (b && b.dataset.action !== "edit-send" && b.dataset.action !== "edit-cancel") act(b);
  });
  picker.addEventListener("change", () => { conv.model = picker.value; if (conv.messages.length) saveSoon(); });
  document.getElementById("sidebar-toggle").addEventListener("click", () => {
    document.body.classList.toggle("sidebar-open");
  });
  document.getElementById("sidebar-backdrop").addEventListener("click", () => {
    document.body.classList.remove("sidebar-open");
  });
  document.addEventListener("tessera:page", (e) => { if (e.detail === "chat") fillPicker(); });
  document.addEventListener("tessera:refresh", fillPicker);
  await fillPicker();
  setBusy(false);
  await open(localStorage.getItem(CURRENT));
}
