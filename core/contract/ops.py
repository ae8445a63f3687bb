"""What a backend's capability probe is asked: one op, described (ggml's ``supports_op``).

The core and the architectures describe each op they may run as an :class:`Op` — its
name, the compute dtype, the input shapes where the caller knows them, and its
parameters — and ask ``backend.supports(op)`` whether the backend *can* run it, then,
where the core has another path to take, ``backend.worth(op)`` whether it *should*.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs


def _frozen(params: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(params))


@attrs.frozen
class Op:
    """One op as a probe sees it.

    ``name`` is one of :data:`tessera.contract.backend.CORE_OPS` or ``OPTIONAL_OPS``;
    ``dtype`` the compute dtype (``"f32"``, ``"bf16"``, ``"f16"``; None when the caller
    does not know it); ``shapes`` the inputs' shapes in numpy order (``()`` when not known);
    ``params`` the op's parameters, by op: ``n_head``, ``n_head_kv``, ``head_dim``
    (attention, attention_rows, attention_softcap; the latter also ``sinks``, True when the
    model has attention sinks); ``n_rot``, ``head_dim``, ``neox``
    (rope, rope_ext); ``n`` (rms_norm's width); ``activation`` (linear); ``n_expert``,
    ``n_expert_used`` (moe_ffn). A backend reads what it needs and ignores the rest.
    """

    name: str
    params: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen)
    dtype: str | None = None
    shapes: tuple[tuple[int, ...], ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        """The parameter ``key``, or ``default`` when the caller did not give it."""
        return self.params.get(key, default)


def op(name: str, *, dtype: str | None = None, **params: Any) -> Op:
    """``Op(name, params, dtype)`` with the parameters as keywords."""
    return Op(name, params, dtype)
