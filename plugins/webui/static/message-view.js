// One message of the chat log as DOM: the user's text (plain) and its attached files,
// or the answer (markdown) with its reasoning in a collapsible block, the token counts
// and speed, and the actions (copy, edit, regenerate).

import { fillMarkdown } from "./markdown.js";

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function actionButton(label, action, title) {
  const b = el("button", "msg-action", label);
  b.type = "button";
  b.dataset.action = action;
  b.title = title;
  return b;
}

function kib(n) {
  return n < 1024 ? n + " B" : (n / 1024).toFixed(1) + " KiB";
}

// "model · 42 tokens · 31.5 tok/s · prompt 120": what an answer cost, when the server said.
export function metaText(m) {
  const parts = [m.model || ""];
  if (m.state === "stopped") parts.push("stopped");
  if (m.usage) {
    parts.push(m.usage.completion_tokens + " tokens");
    if (m.timings && m.timings.predicted_per_second) {
      parts.push(m.timings.predicted_per_second.toFixed(1) + " tok/s");
    }
    parts.push("prompt " + m.usage.prompt_tokens);
  }
  if (m.finish === "length") parts.push("cut at max tokens");
  return parts.filter((p) => p).join(" \u00b7 ");
}

function fillMeta(meta, m) {
  meta.textContent = metaText(m);
  // set afresh in one order: a stream may bring timings before usage, and a restored
  // answer's markup must be the streamed one's
  delete meta.dataset.completionTokens;
  delete meta.dataset.tokensPerSecond;
  if (m.usage) meta.dataset.completionTokens = String(m.usage.completion_tokens);
  if (m.timings) meta.dataset.tokensPerSecond = String(m.timings.predicted_per_second);
}

// Fill (or refill, while streaming) an answer's parts from its message.
export function updateAssistant(article, m) {
  article.dataset.state = m.state || "done";
  article.dataset.chunks = String(m.chunks || 0);
  let thinking = article.querySelector(".thinking");
  if (m.reasoning && !thinking) {
    thinking = el("details", "thinking");
    thinking.open = m.state === "streaming";
    thinking.dataset.fold = thinking.open ? "pending" : "done";
    thinking.appendChild(el("summary", "", "Thinking"));
    thinking.appendChild(el("div", "thinking-body md"));
    article.insertBefore(thinking, article.querySelector(".content"));
  }
  if (thinking) {
    // open while the model thinks, folded once (the reader may open it again) when the
    // answer itself begins
    if (thinking.dataset.fold === "pending" && (m.content || m.state !== "streaming")) {
      thinking.open = false;
      thinking.dataset.fold = "done";
    }
    fillMarkdown(thinking.querySelector(".thinking-body"), m.reasoning);
    thinking.querySelector("summary").textContent =
      m.state === "streaming" && !m.content ? "Thinking\u2026" : "Thoughts";
  }
  fillMarkdown(article.querySelector(".content"), m.content);
  const error = article.querySelector(".error-text");
  error.textContent = m.error || "";
  error.hidden = !m.error;
  fillMeta(article.querySelector(".meta"), m);
}

export function messageElement(m, index) {
  const article = el("article", "msg " + m.role);
  article.dataset.index = String(index);
  const content = el("div", "content" + (m.role === "assistant" ? " md" : ""));
  article.appendChild(content);
  if (m.role === "user") {
    content.textContent = m.content;
    if (m.attachments && m.attachments.length) {
      const list = el("ul", "attachments");
      for (const a of m.attachments) {
        list.appendChild(el("li", "attachment chip", a.name + " (" + kib(a.text.length) + ")"));
      }
      article.appendChild(list);
    }
  }
  article.appendChild(el("div", "error-text"));
  const foot = el("div", "msg-foot");
  foot.appendChild(el("div", "meta"));
  const actions = el("div", "actions");
  actions.appendChild(actionButton("Copy", "copy", "Copy this message's text"));
  if (m.role === "user") actions.appendChild(actionButton("Edit", "edit", "Edit and send again"));
  else actions.appendChild(actionButton("Regenerate", "regenerate", "Answer this again"));
  foot.appendChild(actions);
  article.appendChild(foot);
  if (m.role === "assistant") updateAssistant(article, m);
  return article;
}

// The user's message turned into a text box; onSend(text) or onCancel() ends it.
export function editBox(article, m, onSend, onCancel) {
  const content = article.querySelector(".content");
  const box = el("textarea", "edit-box");
  box.value = m.content;
  box.rows = Math.min(12, Math.max(2, m.content.split("\n").length));
  const send = actionButton("Send", "edit-send", "Send the edited message");
  const cancel = actionButton("Cancel", "edit-cancel", "Keep the message as it was");
  const bar = el("div", "edit-actions");
  bar.append(send, cancel);
  content.replaceChildren(box, bar);
  article.classList.add("editing");
  send.addEventListener("click", () => onSend(box.value));
  cancel.addEventListener("click", onCancel);
  box.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); onSend(box.value); }
    if (e.key === "Escape") onCancel();
  });
  box.focus();
}
