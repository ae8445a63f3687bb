"""What an output-constraint plugin registers: a kind of constraint on generated text.

A constraint keeps a generation inside a language (a JSON schema, a grammar, a regular
expression, a list of choices). A plugin registers one :class:`ConstraintKind` per
language through the ``tessera_register_constraints`` hook. A caller (the server, an
embedding program) checks and compiles a request's spec once with
:meth:`ConstraintKind.compile`, which returns a factory; the engine calls the factory once
per generation (``GenerationRequest.constraint``) and drives the :class:`Constraint` it
returns, one token at a time, on that generation's logits only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from tessera.errors import TesseraError


class ConstraintSpecError(TesseraError):
    """A constraint spec the engine refuses (a schema it cannot compile, a grammar with a
    syntax error); the message names the problem, in the engine's own words."""


class Constraint(ABC):
    """One generation kept inside a language. The engine calls :meth:`sample` with the
    slot's logits row, then :meth:`accept` with the token it returned, and ends the
    generation (finish reason ``stop``) once :attr:`complete` is true."""

    @abstractmethod
    def sample(self, sampler: Any, logits: np.ndarray, history: Sequence[int]) -> int:
        """A token drawn as ``sampler.sample(logits, history)`` would draw it from
        ``logits`` with every token outside the language at -inf. ``logits`` may be longer
        than the vocabulary (padding rows are never tokens). An end-of-generation token
        comes out only where the text so far is a whole sentence of the language. Raises
        :class:`tessera.errors.TesseraError` when no token of the vocabulary can continue."""

    @abstractmethod
    def accept(self, token: int) -> None:
        """Advance past ``token`` (the one :meth:`sample` returned)."""

    @property
    @abstractmethod
    def complete(self) -> bool:
        """True once nothing but the end of generation can follow."""


#: ``compile(spec, tokenizer)``: a factory of fresh :class:`Constraint` objects.
Compile = Callable[[Any, Any], Callable[[], Constraint]]


@attrs.frozen
class ConstraintKind:
    """One kind of constraint, e.g. ``json_schema`` or ``gbnf``.

    ``compile(spec, tokenizer)`` checks ``spec`` (the kind's own form: a schema dict, a
    grammar string, a list of choices ...) against the model's
    :class:`tessera.text.tokenizer.Tokenizer` and returns a factory that makes one
    :class:`Constraint` per generation. It raises :class:`ConstraintSpecError` for a spec
    it refuses, before any generation starts. The first call for a tokenizer may take
    seconds (tables over the whole vocabulary), so callers on an event loop run it in a
    thread; a kind should cache what it compiled per (tokenizer, spec).
    """

    #: The key callers name the kind by (``json_object``, ``json_schema``, ``gbnf`` ...).
    name: str
    compile: Compile = attrs.field(eq=False)
    #: One line for ``tessera plugins``.
    description: str = ""
