// Light and dark themes: "auto" follows prefers-color-scheme; a choice is remembered.
// The CSS does the auto case by itself; here only the explicit choice and the button.

const KEY = "tessera.theme";
const CHOICES = ["auto", "light", "dark"];
const LABELS = { auto: "\u25d0 Auto", light: "\u2600 Light", dark: "\u263e Dark" };
const button = document.getElementById("theme-toggle");
const lightCode = document.getElementById("hljs-light");
const darkCode = document.getElementById("hljs-dark");

function apply(choice) {
  const root = document.documentElement;
  if (choice === "auto") delete root.dataset.theme;
  else root.dataset.theme = choice;
  // the code-highlighting sheets follow the same choice through their media queries
  lightCode.media = choice === "auto" ? "(prefers-color-scheme: light)" : choice === "light" ? "all" : "not all";
  darkCode.media = choice === "auto" ? "(prefers-color-scheme: dark)" : choice === "dark" ? "all" : "not all";
  button.textContent = LABELS[choice];
  button.dataset.choice = choice;
  button.title = "Theme: " + choice + " (click to change)";
}

function current() {
  const stored = localStorage.getItem(KEY);
  return CHOICES.includes(stored) ? stored : "auto";
}

button.addEventListener("click", () => {
  const next = CHOICES[(CHOICES.indexOf(current()) + 1) % CHOICES.length];
  if (next === "auto") localStorage.removeItem(KEY);
  else localStorage.setItem(KEY, next);
  apply(next);
});
apply(current());
