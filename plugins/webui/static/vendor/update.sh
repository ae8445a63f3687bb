#!/bin/sh
# Refresh the vendored browser libraries of the web UI from npm (run from this folder,
# with npm; nothing here runs at build or serve time). Pin the versions below, run it,
# check the page (tests/plugins/webui/test_browser*.py), update README.md's table, commit.
set -eu
MARKED=18.2.1
DOMPURIFY=3.5.0
HIGHLIGHT=11.12.0
KATEX=0.19.1

here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
npm init -y >/dev/null
npm install --no-audit --no-fund --ignore-scripts \
  "marked@$MARKED" "dompurify@$DOMPURIFY" "@highlightjs/cdn-assets@$HIGHLIGHT" "katex@$KATEX"
n=node_modules
cp "$n/marked/lib/marked.umd.js" "$here/marked.umd.js"
cp "$n/marked/LICENSE" "$here/LICENSE.marked"
cp "$n/dompurify/dist/purify.min.js" "$here/purify.min.js"
cp "$n/dompurify/LICENSE" "$here/LICENSE.dompurify"
cp "$n/dompurify/LICENSE-MPL" "$here/LICENSE-MPL.dompurify"
cp "$n/@highlightjs/cdn-assets/highlight.min.js" "$here/highlight.min.js"
cp "$n/@highlightjs/cdn-assets/styles/github.min.css" "$here/highlight-github.min.css"
cp "$n/@highlightjs/cdn-assets/styles/github-dark.min.css" "$here/highlight-github-dark.min.css"
cp "$n/@highlightjs/cdn-assets/LICENSE" "$here/LICENSE.highlight.js"
cp "$n/katex/dist/katex.min.js" "$here/katex.min.js"
cp "$n/katex/LICENSE" "$here/LICENSE.katex"
