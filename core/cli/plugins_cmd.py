"""``tessera plugins``: what is installed, what each backend supports, which paths are active."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tessera import PLUGIN_API_VERSION, __version__
from tessera.cli.plugins_catalogues import DESCRIBED, described
from tessera.contract.backend import CORE_OPS, OPTIONAL_OPS
from tessera.contract.ops import Op
from tessera.engine.context import ContextParams, choose_kv_path, choose_prune
from tessera.errors import TesseraError
from tessera.switches import FLAG_OFF, FLAG_ON, KINDS, read

#: Version of the ``tessera plugins --json`` layout; raised when a key changes meaning.
REPORT_SCHEMA = 1


def add_plugins_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-probe",
        action="store_true",
        help="do not create backends to ask which ops they support (faster)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"print one JSON object (schema {REPORT_SCHEMA}, see docs/extending.md)",
    )
    parser.add_argument(
        "--switches",
        action="store_true",
        help="list every TESSERA_* environment switch (core's and each plugin's) and its value",
    )


def _offers(backend: Any, name: str) -> bool:
    """The backend's probe for op ``name`` in its own dtype (no parameters known here)."""
    return backend.supports(Op(name, dtype=backend.dtype))


def _backend_lines(runtime: Any) -> list[str]:
    lines = []
    kernels = runtime.weight_kernels()
    for name, info in sorted(runtime.backends().items()):
        try:
            backend = info.create(None, None)
        except TesseraError as exc:
            lines.append(f"  {name}: not usable here ({exc})")
            continue
        ops = [op for op in CORE_OPS if _offers(backend, op)]
        missing = [op for op in CORE_OPS if op not in ops]
        lines.append(
            f"  {name}: device={backend.device} dtype={backend.dtype} — {info.description}"
        )
        lines.append(f"    ops: {', '.join(ops)}")
        if missing:
            lines.append(f"    not supported: {', '.join(missing)}")
        for op in OPTIONAL_OPS:
            state = "supported" if _offers(backend, op) else "not supported"
            lines.append(f"    optional {op}: {state}")
        lines.append(
            f"    kv path (default context): {choose_kv_path(None, ContextParams(), backend)}"
        )
        prune = choose_prune(ContextParams())
        state = "allowed" if prune.path else "off"
        lines.append(f"    prefill pruning (default context): {state} ({prune.reason})")
        for (kb, qname), kernel in sorted(kernels.items()):
            if kb == name:
                state = "active" if kernel.supports(backend) else "declined by probe"
                lines.append(f"    kernel {qname}: {state} {kernel.description}".rstrip())
        for (fb, block), fusion in sorted(runtime.block_fusions().items()):
            if fb == name:
                state = "active" if fusion.probe(backend) else "declined by probe"
                lines.append(f"    fusion {block}: {state} {fusion.description}".rstrip())
        for what, choice in backend.paths.items():  # what the probes above decided
            lines.append(f"    {what}: {choice}")
    return lines


def _backend_entry(
    name: str, info: Any, kernels: dict, fusions: dict, probe: bool
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "description": info.description,
        "usable": None,
        "error": None,
        "device": None,
        "dtype": None,
        "ops": None,
        "unsupported_ops": None,
        "kernels": [
            {"quant_type": q, "description": k.description, "state": "not probed"}
            for (b, q), k in sorted(kernels.items())
            if b == name
        ],
        "fusions": [
            {"block": f.block, "description": f.description, "state": "not probed"}
            for (b, _), f in sorted(fusions.items())
            if b == name
        ],
        "paths": None,
    }
    if not probe:
        return entry
    try:
        backend = info.create(None, None)
    except TesseraError as exc:
        return {**entry, "usable": False, "error": str(exc)}
    ops = [op for op in CORE_OPS if _offers(backend, op)]
    for op in OPTIONAL_OPS:  # as the text listing asks: the same paths get decided
        _offers(backend, op)
    for k in entry["kernels"]:
        supported = kernels[(name, k["quant_type"])].supports(backend)
        k["state"] = "active" if supported else "declined by probe"
    for f in entry["fusions"]:
        serves = fusions[(name, f["block"])].probe(backend)
        f["state"] = "active" if serves else "declined by probe"
    return {
        **entry,
        "usable": True,
        "device": backend.device,
        "dtype": backend.dtype,
        "ops": ops,
        "unsupported_ops": [op for op in CORE_OPS if op not in ops],
        "paths": [
            {"what": what, "path": str(choice.path), "reason": choice.reason}
            for what, choice in backend.paths.items()
        ],
    }


def _communicator_entries(runtime: Any) -> list[dict[str, Any]]:
    """Each communicator and its probe on this machine's CPU (no network is touched)."""
    out = []
    for name, info in sorted(runtime.communicators().items()):
        probe = info.probe("cpu")
        out.append(
            {
                "name": name,
                "description": info.description,
                "collective": info.collective,
                "max_ranks": info.max_ranks,
                **probe.as_json(),
            }
        )
    return out


def switch_entries(runtime: Any) -> list[dict[str, Any]]:
    """Every declared switch (core's, then each plugin's) with its value here: ``value`` is
    the variable as set (None when unset), ``error`` the message when the value is one the
    switch does not take."""
    owners = runtime.owners("switch")
    out = []
    for name, switch in runtime.switches().items():
        try:
            read(switch)
            error = None
        except TesseraError as exc:
            error = str(exc)
        out.append(
            {
                "name": name,
                "owner": owners[name],
                "kind": switch.kind,
                "default": switch.shown_default(),
                "choices": list(switch.choices),
                "value": switch.raw() or None,
                "error": error,
                "help": switch.help,
            }
        )
    return out


def _switch_lines(runtime: Any) -> list[str]:
    """The switches as a table, one row each; a value the switch does not take is followed
    by the error that reading it raises."""
    header = ("switch", "owner", "kind", "default", "value", "what it does")
    rows, errors = [header], {}
    for e in switch_entries(runtime):
        value = "unset" if e["value"] is None else e["value"]
        rows.append((e["name"], e["owner"], e["kind"], e["default"], value, e["help"]))
        if e["error"]:
            errors[len(rows) - 1] = e["error"]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = []
    for i, row in enumerate(rows):
        cells = [f"{cell:<{w}}" for cell, w in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, row[-1]]))
        if i in errors:
            lines.append(f"  error: {errors[i]}")
    kinds = " | ".join(f"{kind}: {values}" for kind, values in KINDS.items())
    lines.append(f"kinds — {kinds}. Flags: {'/'.join(FLAG_ON)} or {'/'.join(FLAG_OFF)}.")
    return lines


def plugins_report(runtime: Any, probe: bool = True) -> dict[str, Any]:
    """Everything ``tessera plugins`` shows, as plain data (the ``--json`` schema)."""
    # Build every catalogue first: a plugin whose hook raises shows up in failures then.
    kernels = runtime.weight_kernels()
    archs, qtypes, commands = runtime.architectures(), runtime.quant_types(), runtime.commands()
    backends = [
        _backend_entry(name, info, kernels, runtime.block_fusions(), probe)
        for name, info in sorted(runtime.backends().items())
    ]
    return {
        "schema": REPORT_SCHEMA,
        "tessera_version": __version__,
        "plugin_api": PLUGIN_API_VERSION,
        "plugins": [
            {
                "name": rec.name,
                "module": rec.module,
                "distribution": rec.distribution,
                "version": rec.version,
                "hooks": runtime.hooks_of(rec.name),
            }
            for rec in runtime.plugins
        ],
        "failures": [{"name": f.name, "error": f.error} for f in runtime.failures],
        "architectures": sorted(archs),
        "quant_types": [
            {
                "name": q.name,
                "ggml_type": q.ggml_type,
                "block_size": q.block_size,
                "type_size": q.type_size,
            }
            for q in qtypes.values()
        ],
        "commands": sorted(["plugins", *commands]),
        "backends": backends,
        "conflicts": list(runtime.conflicts),
        "communicators": _communicator_entries(runtime),
        **described(runtime),
        "tokenizer_kinds": [
            {"name": k.name, "models": list(k.models), "description": k.description}
            for k in dict.fromkeys(runtime.catalogue("tokenizer_kind").values())
        ],
        "switches": switch_entries(runtime),
    }


def run_plugins(args: argparse.Namespace, runtime: Any) -> int:
    if args.json:
        print(json.dumps(plugins_report(runtime, probe=not args.no_probe), indent=2))
        return 0
    if args.switches:
        print("\n".join(_switch_lines(runtime)))
        return 0
    print("plugins:")
    for rec in runtime.plugins:
        dist = f"{rec.distribution} {rec.version}".strip()
        hooks = ", ".join(h.removeprefix("tessera_") for h in runtime.hooks_of(rec.name))
        print(f"  {rec.name} ({rec.module}; {dist}): {hooks}")
    for failure in runtime.failures:
        print(f"  {failure.name}: FAILED — {failure.error}")
    print("architectures: " + ", ".join(sorted(runtime.architectures())))
    print("quant types: " + ", ".join(q.name for q in runtime.quant_types().values()))
    print("commands: plugins, " + ", ".join(sorted(runtime.commands())))
    print("backends:")
    if args.no_probe:
        for name, info in sorted(runtime.backends().items()):
            print(f"  {name}: {info.description}")
    else:
        for line in _backend_lines(runtime):
            print(line)
    for entry in _communicator_entries(runtime):
        features = ", ".join(entry["features"])
        state = f"usable here: {features}" if entry["usable"] else entry["reason"]
        kind = "collective" if entry["collective"] else f"at most {entry['max_ranks']} ranks"
        print(f"communicator {entry['name']}: {kind}; {state} — {entry['description']}")
    for key, entries in described(runtime).items():
        for entry in entries:
            print(f"{DESCRIBED[key]} {entry['name']}: {entry['description']}")
    for kind in dict.fromkeys(runtime.catalogue("tokenizer_kind").values()):
        print(f"tokenizer kind {kind.name} ({', '.join(kind.models)}): {kind.description}")
    for conflict in runtime.conflicts:
        print(f"conflict: {conflict}")
    return 0
