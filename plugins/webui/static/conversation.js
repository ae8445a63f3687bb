// What a conversation is (its record in the store) and how it becomes a request to
// /v1/chat/completions: the system prompt first, attachments inside the user's message,
// only the sampler settings that were given.

// The samplers the server's chat route takes, with SamplerParams' defaults as hints.
export const SAMPLERS = [
  { name: "temperature", label: "Temperature", step: "0.05", min: "0", max: "2", hint: "0.8" },
  { name: "top_p", label: "Top p", step: "0.01", min: "0", max: "1", hint: "0.95" },
  { name: "top_k", label: "Top k", step: "1", min: "0", hint: "40", integer: true },
  { name: "min_p", label: "Min p", step: "0.01", min: "0", max: "1", hint: "0.05" },
  { name: "repeat_penalty", label: "Repeat penalty", step: "0.05", min: "0.05", hint: "1.0" },
  { name: "repeat_last_n", label: "Repeat last n", step: "1", min: "-1", hint: "64", integer: true },
  { name: "max_tokens", label: "Max tokens", step: "1", min: "1", hint: "until the end", integer: true },
  { name: "seed", label: "Seed", step: "1", min: "-1", hint: "random", integer: true },
  // the later stages of the chain, behind "More samplers"
  { name: "presence_penalty", label: "Presence penalty", step: "0.05", hint: "0", more: true },
  { name: "frequency_penalty", label: "Frequency penalty", step: "0.05", hint: "0", more: true },
  { name: "typical_p", label: "Typical p", step: "0.01", min: "0", hint: "1 (off)", more: true },
  { name: "top_n_sigma", label: "Top-n-sigma", step: "0.1", hint: "-1 (off)", more: true },
  { name: "xtc_probability", label: "XTC probability", step: "0.01", min: "0", max: "1", hint: "0", more: true },
  { name: "xtc_threshold", label: "XTC threshold", step: "0.01", min: "0", max: "1", hint: "0.1", more: true },
  { name: "dry_multiplier", label: "DRY multiplier", step: "0.05", min: "0", hint: "0 (off)", more: true },
  { name: "dry_base", label: "DRY base", step: "0.05", min: "1", hint: "1.75", more: true },
  { name: "dry_allowed_length", label: "DRY allowed length", step: "1", min: "0", hint: "2", integer: true, more: true },
  { name: "dry_penalty_last_n", label: "DRY last n", step: "1", min: "-1", hint: "64", integer: true, more: true },
];

export function newId() {
  // crypto.randomUUID exists only in secure contexts; a server on a LAN address is not one
  return Date.now().toString(36) + "-" + Math.random().toString(36).slice(2, 10);
}

export function newConversation(model, settings) {
  const now = Date.now();
  return {
    id: newId(),
    title: "New chat",
    created: now,
    updated: now,
    model: model || "",
    settings: Object.assign({ system: "" }, settings || {}),
    messages: [],
  };
}

// A title from the first words the user wrote.
export function titleFrom(text) {
  const line = text.replace(/\s+/g, " ").trim();
  return line.length > 48 ? line.slice(0, 47) + "\u2026" : line || "New chat";
}

// The text the model reads for a user message: what was typed, then each attached file.
export function userContent(message) {
  const files = (message.attachments || []).map(
    (a) => `File ${a.name}:\n\`\`\`\n${a.text}\n\`\`\``);
  return [message.content, ...files].filter((part) => part).join("\n\n");
}

export function apiMessages(conversation) {
  const out = [];
  const system = (conversation.settings.system || "").trim();
  if (system) out.push({ role: "system", content: system });
  for (const m of conversation.messages) {
    if (m.role === "user") out.push({ role: "user", content: userContent(m) });
    else if (m.role === "assistant" && m.content && m.state !== "error") {
      out.push({ role: "assistant", content: m.content });
    }
  }
  return out;
}

export function requestBody(conversation) {
  const body = {
    model: conversation.model,
    messages: apiMessages(conversation),
    stream: true,
    stream_options: { include_usage: true },
  };
  for (const s of SAMPLERS) {
    const value = conversation.settings[s.name];
    if (value !== undefined && value !== null && value !== "") body[s.name] = Number(value);
  }
  return body;
}
