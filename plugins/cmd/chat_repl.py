"""The read-answer loop of ``tessera chat``: a line in, the model's answer streamed out.

Each question is rendered with the whole conversation through the model's chat template;
a :class:`~tessera.engine.cached_sequence.CachedSequence` keeps the conversation so far in
the KV cache, so only the new turn is evaluated. Ctrl-C stops the answer being written (what
was shown stays in the conversation) and returns to the prompt; Ctrl-C twice in a row at the
prompt, Ctrl-D or ``/exit`` leave. Answers go to stdout, notes and errors to stderr.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TextIO

from tessera.engine.cached_sequence import CachedSequence
from tessera.engine.generate import GenerationStats
from tessera.engine.sampling import Sampler
from tessera.errors import ContextOverflowError, TesseraError
from tessera.plugins.cmd.chat_conversation import Conversation
from tessera.text.chat_prompt import encode_chat_prompt, model_chat_template
from tessera.text.stream import StreamDecoder

HELP = """commands:
  /clear         forget the conversation (the system message stays)
  /system TEXT   set the system message (/system alone removes it)
  /save FILE     write the conversation to FILE as JSON
  /load FILE     replace the conversation with the one in FILE
  /help          this list
  /exit          leave (also Ctrl-D, or Ctrl-C twice at the prompt)
Ctrl-C while an answer is written stops it."""

#: What :meth:`ChatRepl.command` returns to end the loop.
EXIT = "exit"


class ChatRepl:
    """One chat session over a context; ``read_line`` is ``input`` (readline) or a test's."""

    def __init__(
        self,
        ctx: Any,
        sampler: Sampler,
        n_predict: int,
        conversation: Conversation,
        *,
        ignore_eos: bool = False,
        read_line: Callable[[str], str] = input,
        prompt: str = "> ",
        out: TextIO,
        err: TextIO,
    ) -> None:
        self.tokenizer = ctx.model.tokenizer
        self.template = model_chat_template(self.tokenizer)
        self.seq = CachedSequence(ctx)
        self.sampler = sampler  # one for the session: a seeded run continues its draws
        self.n_predict = n_predict
        self.conversation = conversation
        self.eog_ids = frozenset() if ignore_eos else self.tokenizer.eog_ids
        self.read_line = read_line
        self.prompt = prompt
        self.out = out
        self.err = err
        #: What the last answer evaluated and generated (for reports and tests).
        self.last_stats: GenerationStats | None = None

    def _note(self, text: str) -> None:
        print(text, file=self.err, flush=True)

    def run(self) -> int:
        """Read and answer until the user leaves; the exit code (0)."""
        interrupted = False  # the last thing at the prompt was a Ctrl-C
        while True:
            # one try around the whole turn: a Ctrl-C that lands between the prompt and an
            # answer (typed quickly after the hint) counts as one at the prompt
            try:
                line = self.read_line(self.prompt)
                interrupted = False
                if self.handle(line.strip()) == EXIT:
                    return 0
            except EOFError:
                self.out.write("\n")
                return 0
            except KeyboardInterrupt:
                if interrupted:
                    self.out.write("\n")
                    return 0
                interrupted = True
                try:
                    self._note("\n(Ctrl-C again, Ctrl-D or /exit to leave)")
                except KeyboardInterrupt:
                    return 0

    def handle(self, line: str) -> str | None:
        """A question is answered, a ``/command`` run, a blank line ignored."""
        if line.startswith("/"):
            return self.command(line)
        if line:
            self.answer(line)
        return None

    def command(self, line: str) -> str | None:
        """Run one ``/command``; :data:`EXIT` to leave. A bad one is an ``error:`` line."""
        name, _, rest = line.partition(" ")
        rest = rest.strip()
        try:
            if name in ("/exit", "/quit"):
                return EXIT
            if name == "/help":
                self._note(HELP)
            elif name == "/clear":
                self.conversation.clear()
                self._note("conversation cleared")
            elif name == "/system":
                self.conversation.system = rest or None
                self._note("system message set" if rest else "system message removed")
            elif name in ("/save", "/load"):
                if not rest:
                    raise TesseraError(f"{name} needs a file name, e.g. {name} chat.json")
                if name == "/save":
                    self.conversation.save(rest)
                    self._note(f"saved {len(self.conversation.messages())} messages to {rest}")
                else:
                    self.conversation = Conversation.load(rest)
                    self._note(f"loaded {len(self.conversation.messages())} messages from {rest}")
            else:
                raise TesseraError(f"unknown command '{name}'; /help lists the commands")
        except TesseraError as exc:
            self._note(f"error: {exc}")
        return None

    def answer(self, question: str) -> None:
        """Add ``question``, stream the answer, and keep what was shown of it."""
        turns = self.conversation.turns
        turns.append({"role": "user", "content": question})
        stats = GenerationStats()
        try:
            text = self.template.render(self.conversation.messages(), add_generation_prompt=True)
            prompt = encode_chat_prompt(self.tokenizer, text)
            tokens = self.seq.generate(
                prompt, self.n_predict, self.sampler, eog_ids=self.eog_ids, stats=stats
            )
        except (TesseraError, KeyboardInterrupt) as exc:
            turns.pop()  # no answer: the question is not part of the conversation
            if isinstance(exc, KeyboardInterrupt):
                self._note("[answer stopped]")
            else:
                way_out = (
                    " (or /clear the conversation)" if isinstance(exc, ContextOverflowError) else ""
                )
                self._note(f"error: {exc}{way_out}")
            return
        shown, stopped = self._stream(tokens)
        turns.append({"role": "assistant", "content": "".join(shown)})
        self.last_stats = stats
        if stopped:
            self._note("[answer stopped]")
        elif len(prompt) + stats.n_generated >= self.seq.ctx.n_ctx:
            self._note(
                f"note: the context ({self.seq.ctx.n_ctx} tokens) is full; /clear the "
                "conversation or start with a larger -c"
            )

    def _stream(self, tokens: Any) -> tuple[list[str], bool]:
        """Write the answer as it comes; the pieces shown and whether Ctrl-C stopped it."""
        decoder = StreamDecoder(self.tokenizer)
        shown: list[str] = []
        stopped = False
        try:
            for token in tokens:
                piece = decoder.feed(token)
                if piece:
                    self.out.write(piece)
                    self.out.flush()
                    shown.append(piece)
            shown.append(decoder.flush())
            self.out.write(shown[-1])
        except KeyboardInterrupt:
            stopped = True  # an incomplete character stays unshown and unsaid
        finally:
            tokens.close()  # the sequence records what the cache holds
        self.out.write("\n")
        self.out.flush()
        return shown, stopped
