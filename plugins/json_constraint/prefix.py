"""An incremental JSON validator: does a byte string keep a document a valid JSON prefix?

A pushdown automaton over bytes (RFC 8259 grammar, RFC 3629 UTF-8 inside strings) whose
top-level value must be an object, as OpenAI's ``response_format: json_object`` asks.
Structured-output sampling (:mod:`tessera.plugins.json_constraint.constraint`) asks it, token by
token, which continuations are still valid and when the object is complete.

Two choices beyond the RFC, both so generation always ends:

- at most ``max_ws_run`` consecutive whitespace bytes (a model cannot loop on spaces);
- the document starts with its ``{`` and ends with the matching ``}``: no whitespace before
  or after (as llama.cpp's JSON grammar, whose root is the object itself).
"""

from __future__ import annotations

from tessera.errors import TesseraError

# Parser modes. The stack holds the open containers as a str of "{" and "[".
START, OBJ_FIRST, OBJ_KEY, COLON, VALUE, ARR_FIRST, AFTER = range(7)
STRING, UTF8, ESCAPE, UNICODE = range(7, 11)
MINUS, ZERO, INT, DOT, FRAC, EXP_MARK, EXP_SIGN, EXP = range(11, 19)
LITERAL, DONE = 19, 20

WHITESPACE = frozenset(b" \t\n\r")
DIGITS = frozenset(b"0123456789")
HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")
ESCAPES = frozenset(b'"\\/bfnrt')
# String bytes that leave the parser state exactly as it was.
STRING_PLAIN = frozenset(range(0x20, 0x80)) - {0x22, 0x5C}
LITERALS = {ord("t"): b"rue", ord("f"): b"alse", ord("n"): b"ull"}
# Modes where whitespace may appear (between tokens of the grammar; not before the object).
STRUCTURAL = frozenset((OBJ_FIRST, OBJ_KEY, COLON, VALUE, ARR_FIRST, AFTER))
# Number modes that already form a whole number, so a delimiter may end them.
NUMBER_ENDS = frozenset((ZERO, INT, FRAC, EXP))


def _utf8_lead(b: int) -> tuple[int, int, int] | None:
    """(continuation bytes still needed, low, high bound of the next one) for a lead byte."""
    if 0xC2 <= b <= 0xDF:
        return 1, 0x80, 0xBF
    if b == 0xE0:
        return 2, 0xA0, 0xBF  # no overlong 3-byte forms
    if 0xE1 <= b <= 0xEC or b in (0xEE, 0xEF):
        return 2, 0x80, 0xBF
    if b == 0xED:
        return 2, 0x80, 0x9F  # no UTF-16 surrogates
    if b == 0xF0:
        return 3, 0x90, 0xBF
    if 0xF1 <= b <= 0xF3:
        return 3, 0x80, 0xBF
    if b == 0xF4:
        return 3, 0x80, 0x8F  # nothing above U+10FFFF
    return None


class JsonPrefix:
    """State of the automaton after some bytes; ``feed`` extends it, ``copy`` forks it."""

    __slots__ = ("mode", "stack", "ws_run", "aux", "is_key", "max_ws_run")

    def __init__(self, max_ws_run: int = 16) -> None:
        if max_ws_run < 0:
            raise TesseraError(f"max_ws_run must be >= 0, got {max_ws_run}")
        self.mode = START
        self.stack = ""
        self.ws_run = 0
        self.aux: object = None  # UTF8: (need, low, high); UNICODE: hex left; LITERAL: rest
        self.is_key = False
        self.max_ws_run = max_ws_run

    def copy(self) -> JsonPrefix:
        new = JsonPrefix.__new__(JsonPrefix)
        new.mode, new.stack, new.ws_run = self.mode, self.stack, self.ws_run
        new.aux, new.is_key, new.max_ws_run = self.aux, self.is_key, self.max_ws_run
        return new

    @property
    def complete(self) -> bool:
        """True once the top-level object is closed; no byte is accepted after that."""
        return self.mode == DONE

    def key(self) -> tuple:
        """The state minus the stack below its top two entries: states with equal keys
        accept the same bytes until a byte is read with two of those entries popped."""
        return (
            self.mode,
            self.aux,
            self.is_key,
            self.ws_run,
            self.stack[-2:],
            len(self.stack) <= 2,
        )

    def accepts(self, data: bytes) -> bool:
        """Whether appending ``data`` keeps a valid prefix (this state is left unchanged)."""
        return self.copy().feed(data)

    def feed(self, data: bytes) -> bool:
        """Append ``data``; False (state then undefined: feed a copy) if it breaks the prefix."""
        step = self.step
        return all(step(b) for b in data)

    def step(self, b: int) -> bool:  # noqa: C901 - one branch per mode reads best as a table
        """Append one byte; False if it cannot continue a valid prefix."""
        mode = self.mode
        if mode in STRUCTURAL and b in WHITESPACE:
            self.ws_run += 1
            return self.ws_run <= self.max_ws_run
        if mode >= STRING:
            return mode != DONE and self._step_token(b)
        self.ws_run = 0
        if mode == START:
            return self._open(b) if b == 0x7B else False
        if mode in (OBJ_FIRST, OBJ_KEY):
            if b == 0x22:
                self.mode, self.is_key = STRING, True
                return True
            return mode == OBJ_FIRST and b == 0x7D and self._close()
        if mode == COLON:
            if b == 0x3A:
                self.mode = VALUE
                return True
            return False
        if mode == AFTER:
            top = self.stack[-1]
            if b == 0x2C:
                self.mode = OBJ_KEY if top == "{" else VALUE
                return True
            return (b == 0x7D and top == "{" or b == 0x5D and top == "[") and self._close()
        if mode == ARR_FIRST and b == 0x5D:
            return self._close()
        return self._value(b)  # VALUE or ARR_FIRST

    def _open(self, b: int) -> bool:
        self.stack += "{" if b == 0x7B else "["
        self.mode = OBJ_FIRST if b == 0x7B else ARR_FIRST
        return True

    def _close(self) -> bool:
        self.stack = self.stack[:-1]
        self.mode = AFTER if self.stack else DONE
        return True

    def _value(self, b: int) -> bool:
        if b in (0x7B, 0x5B):
            return self._open(b)
        if b == 0x22:
            self.mode, self.is_key = STRING, False
        elif b == 0x2D:
            self.mode = MINUS
        elif b == 0x30:
            self.mode = ZERO
        elif b in DIGITS:
            self.mode = INT
        elif b in LITERALS:
            self.mode, self.aux = LITERAL, LITERALS[b]
        else:
            return False
        return True

    def _step_token(self, b: int) -> bool:  # noqa: C901 - strings, numbers and literals
        mode = self.mode
        if mode == STRING:
            if b == 0x22:
                self.mode, self.is_key = (COLON if self.is_key else AFTER), False
            elif b == 0x5C:
                self.mode = ESCAPE
            elif b >= 0x80:
                lead = _utf8_lead(b)
                if lead is None:
                    return False
                self.mode, self.aux = UTF8, lead
            return b >= 0x20
        if mode == UTF8:
            need, low, high = self.aux
            if not low <= b <= high:
                return False
            self.mode, self.aux = (UTF8, (need - 1, 0x80, 0xBF)) if need > 1 else (STRING, None)
            return True
        if mode == ESCAPE:
            if b == 0x75:
                self.mode, self.aux = UNICODE, 4
                return True
            self.mode = STRING
            return b in ESCAPES
        if mode == UNICODE:
            self.mode, self.aux = (UNICODE, self.aux - 1) if self.aux > 1 else (STRING, None)
            return b in HEX_DIGITS
        if mode == LITERAL:
            rest = self.aux
            if b != rest[0]:
                return False
            self.mode, self.aux = (LITERAL, rest[1:]) if len(rest) > 1 else (AFTER, None)
            return True
        return self._step_number(b)

    def _step_number(self, b: int) -> bool:
        mode = self.mode
        digit = b in DIGITS
        if mode in (MINUS, DOT, EXP_SIGN):
            if not digit:
                return False
            self.mode = {MINUS: ZERO if b == 0x30 else INT, DOT: FRAC, EXP_SIGN: EXP}[mode]
            return True
        if mode == EXP_MARK:
            if b in (0x2B, 0x2D):
                self.mode = EXP_SIGN
                return True
            self.mode = EXP
            return digit
        if digit and mode != ZERO:
            return True
        if b == 0x2E and mode in (ZERO, INT):
            self.mode = DOT
            return True
        if b in (0x65, 0x45) and mode in (ZERO, INT, FRAC):
            self.mode = EXP_MARK
            return True
        # A delimiter ends the number; the delimiter itself is read in AFTER mode.
        self.mode = AFTER
        return self.step(b)
