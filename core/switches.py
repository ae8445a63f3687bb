"""Every ``TESSERA_*`` environment switch: declared once, read one way, and the one function
through which a switched path is chosen, with its reason.

A :class:`Switch` names its variable, says in one line what it does, and has a kind that
fixes how its value is read (one reader per kind):

- ``off`` (:func:`flag`): setting it (``1``) turns a path off, for comparison;
- ``on`` (:func:`flag`): a behaviour that is on or off by ``default``; ``0`` / ``1`` override;
- ``names`` (:func:`names`): a comma-separated list of names;
- ``choice`` (:func:`text`): one of the switch's ``choices`` (any case);
- ``name`` (:func:`text`): one name, checked where it is used (e.g. a communicator);
- ``number`` (:func:`number`): a number such as a row count; ``inf`` allowed.

Flags read ``1 true yes on`` as on and ``0 false no off`` as off, in any case; an empty
value is the same as unset. A value a switch cannot take raises
:class:`~tessera.errors.SwitchValueError` naming the switch, the value and what it takes.

:func:`choose` decides between a switched path and its fallback: the switch, when it turns
the path off, wins (reason ``disabled by TESSERA_X=1``); otherwise the probe's answer gives
the path and its reason. The caller records the :class:`Choice` on the object that made it,
where paths are reported (``Backend.placements``, ``Backend.paths``, a context's
attributes), so ``tessera plugins`` and ``-v`` show ``path (reason)``.

Core's own switches are declared here (:data:`CORE_SWITCHES`); a plugin declares its own as
module-level ``Switch(...)`` values and registers them with ``tessera_register_switches``.
This module is the only place that reads a ``TESSERA_*`` variable from the environment.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import attrs

from tessera.errors import SwitchValueError

OFF, ON, NAMES, CHOICE, NAME, NUMBER = "off", "on", "names", "choice", "name", "number"
#: Every kind, with the values it takes as ``tessera plugins --switches`` explains them.
KINDS = {
    OFF: "a flag; 1 turns its path off",
    ON: "a flag; 1 on, 0 off, unset: the default",
    NAMES: "comma-separated names",
    CHOICE: "one of a few values (any case)",
    NAME: "one name",
    NUMBER: "a number; inf allowed",
}
FLAG_ON = ("1", "true", "yes", "on")
FLAG_OFF = ("0", "false", "no", "off")


def _tessera_name(instance: Any, attribute: Any, value: str) -> None:
    if not value.startswith("TESSERA_") or value != value.upper():
        raise ValueError(f"a switch name is an upper-case TESSERA_* variable, not '{value}'")


@attrs.frozen
class Switch:
    """One environment switch: its variable, what it does (one line), its kind and default.

    ``default`` is what the reader returns when the variable is unset or empty: a bool for
    ``on`` flags (``off`` flags are False), else None unless given; where the default
    depends on the machine, the ``help`` line says so.
    """

    name: str = attrs.field(validator=_tessera_name)
    help: str
    kind: str = attrs.field(validator=attrs.validators.in_(KINDS))
    default: bool | float | str | None = None
    #: The values a ``choice`` switch takes (compared in lower case).
    choices: tuple[str, ...] = ()
    #: For a ``number`` switch that gates a path: the value that turns the path off
    #: (e.g. 0 for "never use the int4 kernel"), so :func:`choose` can say so.
    off_at: float | None = None

    def raw(self) -> str:
        """The variable's value as set, stripped ("" when unset)."""
        return os.environ.get(self.name, "").strip()

    def shown_default(self) -> str:
        """The default as ``tessera plugins --switches`` shows it: ``0``/``1`` for flags."""
        if self.kind in (OFF, ON):
            return "1" if self.default else "0"
        return "unset" if self.default is None else str(self.default)


def _refuse(switch: Switch, value: str, allowed: str) -> SwitchValueError:
    return SwitchValueError(
        f"{switch.name}={value!r} is not a value this switch takes; use {allowed}, or unset it"
    )


def _check_kind(switch: Switch, *kinds: str) -> None:
    if switch.kind not in kinds:
        raise TypeError(f"{switch.name} is a '{switch.kind}' switch, not one of {kinds}")


def flag(switch: Switch) -> bool:
    """The value of an ``on`` or ``off`` flag (``off``: True means the path is off)."""
    _check_kind(switch, ON, OFF)
    value = switch.raw()
    if not value:
        return bool(switch.default)
    if value.lower() in FLAG_ON:
        return True
    if value.lower() in FLAG_OFF:
        return False
    raise _refuse(switch, value, f"one of {', '.join(FLAG_ON)} or {', '.join(FLAG_OFF)}")


def names(switch: Switch) -> list[str]:
    """The non-empty, stripped names of a ``names`` switch, in order (``[]`` when unset)."""
    _check_kind(switch, NAMES)
    return [part.strip() for part in switch.raw().split(",") if part.strip()]


def text(switch: Switch) -> str | None:
    """The value of a ``choice`` switch (lower case, one of its choices) or of a ``name``
    switch (as set); None when unset."""
    _check_kind(switch, CHOICE, NAME)
    value = switch.raw()
    if not value:
        return switch.default  # type: ignore[return-value]
    if switch.kind == NAME:
        return value
    if value.lower() not in switch.choices:
        raise _refuse(switch, value, f"one of {', '.join(switch.choices)}")
    return value.lower()


def number(switch: Switch) -> float | None:
    """The value of a ``number`` switch; None when unset (the caller's default applies)."""
    _check_kind(switch, NUMBER)
    value = switch.raw()
    if not value:
        return switch.default  # type: ignore[return-value]
    try:
        got = float(value)
    except ValueError:
        got = math.nan
    if math.isnan(got):
        raise _refuse(switch, value, "a number such as 16, or inf")
    return got


#: The reader of each kind.
READERS: dict[str, Callable[[Switch], Any]] = {
    OFF: flag,
    ON: flag,
    NAMES: names,
    CHOICE: text,
    NAME: text,
    NUMBER: number,
}


def read(switch: Switch) -> Any:
    """The switch's value through its kind's reader."""
    return READERS[switch.kind](switch)


class Choice(NamedTuple):
    """Which path was taken and why. A pair, so callers that returned ``(path, why)``
    before keep unpacking it; ``str(choice)`` is ``"path (reason)"``."""

    path: Any
    reason: str

    def __str__(self) -> str:
        path = f"{self.path:g}" if isinstance(self.path, float) else self.path
        return f"{path} ({self.reason})"


#: A probe's answer: whether the path can be taken, optionally with the reason.
Answer = bool | tuple[bool, str]


def turned_off(switch: Switch) -> bool:
    """Whether ``switch`` is set so as to turn its path off."""
    if switch.kind == OFF:
        return flag(switch)
    if switch.kind == ON:
        return not flag(switch)
    if switch.kind == NUMBER:
        return switch.off_at is not None and number(switch) == switch.off_at
    raise TypeError(f"{switch.name} is a '{switch.kind}' switch; it gates no path")


def choose(
    switch: Switch,
    probe: Answer | Callable[[], Answer],
    on: Any = True,
    off: Any = False,
) -> Choice:
    """The path to take: ``off`` when ``switch`` turns it off (reason ``disabled by
    TESSERA_X=value``), else ``on`` or ``off`` as the probe answers.

    ``probe`` is the answer (``True``/``False``, or ``(ok, reason)``) or a function giving
    it; pass a function when probing costs something, so a switched-off path never runs
    its probe. A bare bool gets the reason "probe says yes" / "probe says no". ``on`` and
    ``off`` name the two paths in the Choice (default True and False).
    """
    if turned_off(switch):
        value = switch.raw()  # empty only for an ``on`` flag that is off by default
        return Choice(
            off, f"disabled by {switch.name}={value}" if value else f"off unless {switch.name}=1"
        )
    answer = probe() if callable(probe) else probe
    if isinstance(answer, tuple):
        ok, reason = answer
    else:
        ok, reason = answer, "probe says yes" if answer else "probe says no"
    return Choice(on if ok else off, reason)


# -- core's switches -------------------------------------------------------------------

PLUGINS = Switch(
    "TESSERA_PLUGINS", "load only these plugin entry points (an allowlist, for tests)", NAMES
)
DISABLE_PLUGINS = Switch(
    "TESSERA_DISABLE_PLUGINS", "plugin entry points not to load (also --disable-plugins)", NAMES
)
STRICT_PLUGINS = Switch(
    "TESSERA_STRICT_PLUGINS",
    "raise on the first plugin that fails to load or register instead of skipping it",
    ON,
    default=False,
)
TRACE_HOOKS = Switch(
    "TESSERA_TRACE_HOOKS", "print every hook call and its result to stderr", ON, default=False
)
DISABLE_KERNELS = Switch(
    "TESSERA_DISABLE_KERNELS",
    "quant types (or all) whose weight kernels are off: backends dequantize those weights",
    NAMES,
)
KV_ROWS_DISABLE = Switch(
    "TESSERA_KV_ROWS_DISABLE",
    "dense-mask KV attention instead of the row-indexed attention_rows path",
    OFF,
)
PRUNE_DISABLE = Switch(
    "TESSERA_PRUNE_DISABLE", "no prefill pruning before the first KV-shared layer", OFF
)
BATCHED_COPY_DISABLE = Switch(
    "TESSERA_BATCHED_COPY_DISABLE",
    "state save/restore moves tensors one at a time instead of the backend's set_n/get_n",
    OFF,
)
MOE_FFN_DISABLE = Switch(
    "TESSERA_MOE_FFN_DISABLE",
    "MoE layers compose the routed experts from core ops instead of the backend's moe_ffn",
    OFF,
)
COMMUNICATOR = Switch(
    "TESSERA_COMMUNICATOR",
    "the communicator of tensor-parallel runs (also --communicator)",
    NAME,
)
FAST_EXIT_DISABLE = Switch(
    "TESSERA_FAST_EXIT_DISABLE",
    "the tessera program exits through the interpreter's full teardown (~0.3 s with torch)",
    OFF,
)
SPEC_ADAPTIVE = Switch(
    "TESSERA_SPEC_ADAPTIVE",
    "adaptive draft length in speculative decoding; 0 keeps it at --draft-max",
    ON,
    default=True,
)

#: Core's switches, in the order ``tessera plugins --switches`` lists them.
CORE_SWITCHES = (
    PLUGINS,
    DISABLE_PLUGINS,
    STRICT_PLUGINS,
    TRACE_HOOKS,
    DISABLE_KERNELS,
    KV_ROWS_DISABLE,
    PRUNE_DISABLE,
    BATCHED_COPY_DISABLE,
    MOE_FFN_DISABLE,
    COMMUNICATOR,
    SPEC_ADAPTIVE,
    FAST_EXIT_DISABLE,
)
