"""llama.cpp's RWKV tokenizer: the longest vocabulary token at each position, over bytes.

RWKV vocabularies hold arbitrary bytes, so GGUF stores each token escaped (``\\n``, ``\\t``,
``\\r``, ``\\xHH``, a backslash before any other character); tokens are matched and rendered
unescaped.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera.text.vocab import TokenizerError


def unescape_rwkv(token: str) -> bytes:
    """The bytes of an escaped RWKV token, read exactly as llama.cpp reads them."""
    out = bytearray()
    escaping, hex_left, acc = False, 0, 0
    for c in token.encode():
        if hex_left:
            # llama.cpp reads hex digits as c - 'a' + 10 or c - '0'
            acc = ((acc << 4) + (c - 87 if c >= 97 else c - 48)) & 0xFF
            hex_left -= 1
            if not hex_left:
                out.append(acc)
                acc = 0
        elif escaping:
            escaping = False
            if c == 0x78:  # x
                hex_left = 2
            else:
                out.append({0x74: 9, 0x6E: 10, 0x72: 13}.get(c, c))  # t n r, else itself
        elif c == 0x5C:  # backslash
            escaping = True
        else:
            out.append(c)
    return bytes(out)


class RwkvModel:
    """Text -> ids by greedy longest match of the unescaped tokens."""

    def __init__(self, tokens: Sequence[str], unk_id: int | None) -> None:
        self._ids: dict[bytes, int] = {}
        lengths: dict[int, set[int]] = {}
        for tid, token in enumerate(tokens):
            data = unescape_rwkv(token)
            if data:
                self._ids[data] = tid  # the later of two equal tokens wins, as in llama.cpp
                lengths.setdefault(data[0], set()).add(len(data))
        self._lengths = {b: sorted(ls, reverse=True) for b, ls in lengths.items()}
        self._unk = unk_id

    def encode(self, text: str, after_special: bool) -> list[int]:
        data = text.encode("utf-8", "surrogatepass")
        out: list[int] = []
        ids, pos = self._ids, 0
        while pos < len(data):
            for n in self._lengths.get(data[pos], ()):
                tid = ids.get(data[pos : pos + n])
                if tid is not None:
                    out.append(tid)
                    pos += n
                    break
            else:
                if self._unk is None:
                    raise TokenizerError(
                        f"byte 0x{data[pos]:02x} starts no token of this RWKV vocabulary and "
                        "it names no unknown token; the vocabulary is incomplete"
                    )
                out.append(self._unk)  # llama.cpp: no token starts with this byte
                pos += 1
        return out
