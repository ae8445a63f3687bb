"""llama.cpp's UGM tokenizer (``t5``): SentencePiece's unigram model.

The text is normalized by the precompiled charsmap (longest match first; user-defined tokens
pass unchanged), its spaces become ``▁`` (one prefixed, runs merged when the file asks), and
the best segmentation is found by Viterbi over the token log-probabilities: a user-defined
token scores 0, a code point no token covers is the unknown token at the lowest score minus
10, and unknown tokens next to each other are merged into one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tessera.plugins.tokenizers.charsmap import Charsmap
from tessera.text.prefix_matcher import PrefixMatcher
from tessera.text.vocab import SPACE_MARKER, TokenAttr, TokenizerError
from tessera.text.vocab_config import VocabConfig

_UNKNOWN_PENALTY = np.float32(10.0)
_FLT_MAX = float(np.finfo(np.float32).max)


class UgmModel:
    """Text -> ids the way llama.cpp's UGM session does it."""

    def __init__(
        self,
        config: VocabConfig,
        tokens: Sequence[str],
        scores: Sequence[float],
        attrs: Sequence[int],
        unk_id: int | None,
        metadata: Mapping[str, Any],
    ) -> None:
        if unk_id is None:
            raise TokenizerError("the unigram vocabulary names no unknown token; convert it again")
        blob = metadata.get("tokenizer.ggml.precompiled_charsmap")
        self._charsmap = (
            Charsmap(bytes(np.asarray(blob, dtype=np.uint8)))
            if blob is not None and len(blob)
            else None
        )
        normal, user = int(TokenAttr.NORMAL), int(TokenAttr.USER_DEFINED)
        usable = normal | user | int(TokenAttr.UNUSED)
        self._matcher = PrefixMatcher((t, i) for i, t in enumerate(tokens) if attrs[i] & usable)
        user_defined = [t.encode() for t, a in zip(tokens, attrs, strict=True) if a & user]
        self._user_prefixes = {u[:k] for u in user_defined for k in range(1, len(u) + 1)}
        # llama.cpp scores in double, from float32 scores; user-defined tokens score 0
        self._scores = [0.0 if a & user else float(s) for s, a in zip(scores, attrs, strict=False)]
        lowest = min((s for s, a in zip(scores, attrs, strict=False) if a & normal), default=None)
        min_score = np.float32(_FLT_MAX if lowest is None else lowest)
        self._unknown_score = float(np.float32(min_score - _UNKNOWN_PENALTY))
        self._unk = unk_id
        self._space = SPACE_MARKER if config.escape_whitespaces else " "
        self._prefix_space = config.add_space_prefix
        self._merge_spaces = config.remove_extra_whitespaces
        starts = (self._charsmap.first_bytes if self._charsmap else set()) | {
            u[0] for u in user_defined
        }
        body = b"".join(re.escape(bytes([b])) for b in sorted(starts))
        self._plain = re.compile(b"[^" + body + b"]+" if body else rb"[\x00-\xff]+")

    def encode(self, text: str, after_special: bool) -> list[int]:
        return self._viterbi(self.normalize(text))

    def normalize(self, text: str) -> str:
        """The text the unigram model segments: charsmap-normalized, spaces escaped."""
        data = text.encode("utf-8", "surrogatepass")
        out: list[bytes] = []
        pos = 0
        while pos < len(data):
            run = self._plain.match(data, pos)
            if run:  # bytes nothing rewrites: copied as they are
                out.append(data[pos : run.end()])
                pos = run.end()
                continue
            n = 0  # llama.cpp keeps the longest prefix of a user-defined token as it is
            while pos + n < len(data) and data[pos : pos + n + 1] in self._user_prefixes:
                n += 1
            if n:
                out.append(data[pos : pos + n])
                pos += n
                continue
            match = self._charsmap.longest_match(data, pos) if self._charsmap else None
            if match:
                out.append(match[1])
                pos += match[0]
                continue
            n = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[data[pos] >> 4]
            out.append(data[pos : pos + n])
            pos += n
        normalized = b"".join(out).decode("utf-8", "surrogateescape")
        space = self._space
        if self._merge_spaces:
            return "".join(space + word for word in normalized.split(" ") if word)
        escaped = normalized.replace(" ", space)
        first = len(normalized) - len(normalized.lstrip(" "))
        if self._prefix_space and first < len(normalized):
            escaped = escaped[:first] + space + escaped[first:]
        return escaped

    def _viterbi(self, text: str) -> list[int]:
        n = len(text)
        if not n:
            return []
        unk, scores, unknown_score = self._unk, self._scores, self._unknown_score
        best = [-_DBL_MAX] * (n + 1)
        best[0] = 0.0
        token = [unk] * (n + 1)
        start = [0] * (n + 1)
        for i in range(n):
            here = best[i]
            single = False
            for length, tid in self._matcher.matches(text, i):
                single = single or length == 1
                score = here + scores[tid]
                if score > best[i + length]:
                    best[i + length], token[i + length], start[i + length] = score, tid, i
            if not single:
                score = here + unknown_score
                if score > best[i + 1]:
                    best[i + 1], token[i + 1], start[i + 1] = score, unk, i
        ids: list[int] = []
        end, prev_unknown = n, False
        while True:
            tid = token[end]
            if not (prev_unknown and tid == unk):
                ids.append(tid)
            if start[end] == 0:
                break
            prev_unknown = tid == unk
            end = start[end]
        return ids[::-1]


_DBL_MAX = float(np.finfo(np.float64).max)
