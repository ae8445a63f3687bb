"""The choice of communicator for a tensor-parallel group, made on rank 0 for every rank.

From the probes every rank sent (each communicator's ``probe(device)``), the first
communicator that *every* rank can use:

1. the one named by ``--communicator`` / ``TESSERA_COMMUNICATOR`` (an error if some rank
   cannot use it), else
2. a collective communicator (``collective=True``, e.g. ``torch-distributed``), else
3. a point-to-point one whose ``max_ranks`` covers the group (``pairwise``: two ranks),
4. else the group is refused with a sentence naming what each rank lacks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tessera.contract.comm import CommunicatorError, CommunicatorInfo, CommunicatorProbe
from tessera.switches import COMMUNICATOR, text


def choose_communicator(
    infos: Mapping[str, CommunicatorInfo],
    probes: Sequence[Mapping[str, CommunicatorProbe]],
    requested: str | None = None,
) -> tuple[str, tuple[str, ...], str]:
    """``(name, common features, why)`` for a group whose rank ``r`` answered ``probes[r]``.

    ``requested`` (or ``TESSERA_COMMUNICATOR``) forces one. Raises
    :class:`CommunicatorError` naming what is missing when no communicator fits.
    """
    world_size = len(probes)
    requested = requested or text(COMMUNICATOR)

    def lacking(name: str) -> list[str]:
        out = []
        for rank, answers in enumerate(probes):
            p = answers.get(name)
            if p is None or not p.usable:
                out.append(f"rank {rank}: {p.reason if p else 'not installed'}")
        return out

    def common(name: str) -> tuple[str, ...]:
        sets = [set(answers[name].features) for answers in probes]
        first = probes[0][name].features
        return tuple(f for f in first if all(f in s for s in sets))

    def fits(info: CommunicatorInfo) -> bool:
        return info.max_ranks is None or world_size <= info.max_ranks

    if requested is not None:
        if requested not in infos:
            known = ", ".join(sorted(infos)) or "none"
            raise CommunicatorError(
                f"unknown communicator '{requested}'; the installed communicators are: {known}"
            )
        if not fits(infos[requested]):
            raise CommunicatorError(
                f"communicator '{requested}' connects at most {infos[requested].max_ranks} "
                f"ranks, not {world_size}; use a collective communicator or fewer ranks"
            )
        if missing := lacking(requested):
            raise CommunicatorError(
                f"communicator '{requested}' is not usable on every rank ("
                + "; ".join(missing)
                + "); choose another with --communicator"
            )
        return requested, common(requested), "requested"
    ordered = sorted(infos.values(), key=lambda i: (not i.collective, i.name))
    reasons = []
    for info in ordered:
        if not fits(info):
            reasons.append(f"{info.name} connects at most {info.max_ranks} ranks")
            continue
        if missing := lacking(info.name):
            reasons.append(f"{info.name} is not usable on " + ", ".join(missing))
            continue
        kind = "collective" if info.collective else "point-to-point fallback"
        return info.name, common(info.name), f"{kind}, usable on all {world_size} ranks"
    raise CommunicatorError(
        f"no communicator can connect these {world_size} ranks ("
        + "; ".join(reasons or ["no communicator plugin is installed"])
        + "); install torch with torch.distributed on every rank, or use --tp 2"
    )
