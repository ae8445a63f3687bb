// Model output as HTML: marked (GitHub-flavoured markdown), highlight.js for code,
// KaTeX for math, and DOMPurify over the result before it reaches the page: a model's
// text is untrusted, so no script, handler or javascript: link survives.

import { mathExtension } from "./math.js";

const md = new marked.Marked({ gfm: true, breaks: false }, mathExtension, {
  renderer: {
    code({ text, lang }) {
      const language = (lang || "").trim().split(/\s+/)[0];
      const known = language && hljs.getLanguage(language);
      const result = known
        ? hljs.highlight(text, { language, ignoreIllegals: true })
        : hljs.highlightAuto(text);
      const name = known ? language : result.language || "";
      return `<pre><code class="hljs${name ? " language-" + name : ""}">${result.value}</code></pre>\n`;
    },
  },
});

// Links open in a new tab and cannot reach back into this page.
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

export function renderMarkdown(text) {
  const html = md.parse(text || "");
  return DOMPurify.sanitize(html, { USE_PROFILES: { html: true, mathMl: true } });
}

// Put sanitized markdown into an element and give each code block a copy button.
export function fillMarkdown(element, text) {
  element.innerHTML = renderMarkdown(text);
  for (const pre of element.querySelectorAll("pre")) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "copy-code";
    b.dataset.action = "copy-code";
    b.textContent = "Copy";
    pre.appendChild(b);
  }
}
