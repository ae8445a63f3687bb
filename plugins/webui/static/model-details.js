// A model's metadata in a dialog: architecture, parameters, context, the quant types and
// how much of the weights each holds, the chat template, and every other metadata value.

import { api, status } from "./api.js";

const dialog = document.getElementById("model-details");
const body = document.getElementById("model-details-body");
document.getElementById("model-details-close").addEventListener("click", () => dialog.close());

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

// 5475584 -> "5.48 M", as model cards count parameters.
export function countLabel(n) {
  if (!n) return "";
  for (const [size, unit] of [[1e12, "T"], [1e9, "B"], [1e6, "M"], [1e3, "K"]]) {
    if (n >= size) return (n / size).toFixed(2) + " " + unit;
  }
  return String(n);
}

function facts(d) {
  const dl = el("dl", "facts");
  const rows = [
    ["Architecture", d.architecture], ["Name in the file", d.model_name],
    ["Parameters", d.parameters ? countLabel(d.parameters) + " (" + d.parameters.toLocaleString("en") + ")" : ""],
    ["Context", d.n_ctx ? d.n_ctx + " loaded / " + d.n_ctx_train + " trained" : d.n_ctx_train],
    ["Layers", d.n_layer], ["Embedding", d.n_embd],
    ["Heads (KV)", d.n_head ? d.n_head + (d.n_head_kv ? " (" + d.n_head_kv + ")" : "") : ""],
    ["Vocabulary", d.n_vocab], ["Format", d.format === "hf" ? "Hugging Face folder" : "GGUF"],
    ["Size", d.size ? (d.size / 1048576).toFixed(1) + " MiB" : ""], ["State", d.state], ["Path", d.path],
  ];
  for (const [name, value] of rows) {
    if (value === undefined || value === null || value === "") continue;
    const key = name.toLowerCase().replace(/[^a-z]+/g, "-").replace(/-$/, "");
    dl.append(el("dt", "", name), el("dd", "fact-" + key, value));
  }
  return dl;
}

function quantTable(types) {
  const table = el("table", "quant-types");
  table.appendChild(el("thead")).appendChild(el("tr")).append(
    el("th", "", "Type"), el("th", "", "Tensors"), el("th", "", "Share of weights"));
  const tbody = table.appendChild(el("tbody"));
  for (const t of types) {
    const tr = tbody.appendChild(el("tr"));
    tr.dataset.type = t.type;
    const share = el("td", "share");
    const bar = el("progress");
    bar.max = 1;
    bar.value = t.share;
    share.append(bar, " " + (t.share * 100).toFixed(1) + " %");
    tr.append(el("td", "", t.type), el("td", "num", t.tensors), share);
  }
  return table;
}

function metadataTable(meta) {
  const details = el("details", "metadata");
  const keys = Object.keys(meta || {});
  details.appendChild(el("summary", "", "All metadata (" + keys.length + " keys)"));
  const table = details.appendChild(el("table"));
  for (const key of keys) {
    const value = meta[key];
    const tr = table.appendChild(el("tr"));
    tr.append(el("th", "", key), el("td", "", typeof value === "string" ? value : JSON.stringify(value)));
  }
  return details;
}

export async function showDetails(name) {
  let d;
  try {
    d = await api("/api/models/" + encodeURIComponent(name));
  } catch (e) {
    status(e.message);
    return;
  }
  dialog.dataset.name = name;
  document.getElementById("model-details-title").textContent = name;
  body.replaceChildren();
  if (d.error) body.appendChild(el("p", "error-text", d.error));
  body.appendChild(facts(d));
  if (d.quant_types && d.quant_types.length) {
    body.append(el("h3", "", "Quant types"), quantTable(d.quant_types));
  }
  body.appendChild(el("h3", "", "Chat template"));
  body.appendChild(d.chat_template ? el("pre", "chat-template", d.chat_template)
    : el("p", "muted", "none in the file: the server renders chats as ChatML"));
  if (d.metadata) body.appendChild(metadataTable(d.metadata));
  if (!dialog.open) dialog.showModal();
}
