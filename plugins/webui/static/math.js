// A marked extension for TeX math: $$...$$ and \[...\] as display math, $...$ and
// \(...\) inline, rendered by KaTeX as MathML (which the browser typesets itself, so
// KaTeX's fonts and style sheet are not needed).

function tex(source, displayMode) {
  return katex.renderToString(source, { displayMode, output: "mathml", throwOnError: false });
}

// Inline $...$ as pandoc reads it: no space just inside the dollars and no digit right
// after the closing one, so "$5 and $10" stays text.
const INLINE_DOLLAR = /^\$(?=[^\s$])((?:\\.|[^\\$\n])*?[^\s\\$])\$(?!\d)/;
const INLINE_PAREN = /^\\\(([\s\S]+?)\\\)/;
const BLOCK_DOLLAR = /^\$\$([\s\S]+?)\$\$[ \t]*(?:\n|$)/;
const BLOCK_BRACKET = /^\\\[([\s\S]+?)\\\][ \t]*(?:\n|$)/;

export const mathExtension = {
  extensions: [
    {
      name: "mathBlock",
      level: "block",
      start: (src) => src.match(/\$\$|\\\[/)?.index,
      tokenizer(src) {
        const m = BLOCK_DOLLAR.exec(src) || BLOCK_BRACKET.exec(src);
        if (m) return { type: "mathBlock", raw: m[0], text: m[1].trim() };
        return undefined;
      },
      renderer: (token) => `<div class="math-block">${tex(token.text, true)}</div>\n`,
    },
    {
      name: "mathInline",
      level: "inline",
      start: (src) => src.match(/\$|\\\(/)?.index,
      tokenizer(src) {
        const m = INLINE_DOLLAR.exec(src) || INLINE_PAREN.exec(src);
        if (m) return { type: "mathInline", raw: m[0], text: m[1].trim() };
        return undefined;
      },
      renderer: (token) => tex(token.text, false),
    },
  ],
};
