"""``tessera plugins``: what is installed, what each backend supports, which paths are active."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tessera import PLUGIN_API_VERSION, __version__
from tessera.contract.backend import CORE_OPS, OPTIONAL_OPS
from tessera.engine.context import ContextParams, choose_kv_path
from tessera.errors import TesseraError

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


def _backend_lines(runtime: Any) -> list[str]:
    lines = []
    kernels = runtime.weight_kernels()
    for name, info in sorted(runtime.backends().items()):
        try:
            backend = info.create(None, None)
        except TesseraError as exc:
            lines.append(f"  {name}: not usable here ({exc})")
            continue
        ops = [op for op in CORE_OPS if backend.supports(op)]
        missing = [op for op in CORE_OPS if op not in ops]
        lines.append(
            f"  {name}: device={backend.device} dtype={backend.dtype} — {info.description}"
        )
        lines.append(f"    ops: {', '.join(ops)}")
        if missing:
            lines.append(f"    not supported: {', '.join(missing)}")
        for op in OPTIONAL_OPS:
            state = "supported" if backend.supports(op) else "not supported"
            lines.append(f"    optional {op}: {state}")
        path, why = choose_kv_path(None, ContextParams(), backend)
        lines.append(f"    kv path (default context): {path} ({why})")
        for (kb, qname), kernel in sorted(kernels.items()):
            if kb == name:
                state = "active" if kernel.supports(backend) else "declined by probe"
                lines.append(f"    kernel {qname}: {state} {kernel.description}".rstrip())
    return lines


def _backend_entry(name: str, info: Any, kernels: dict, probe: bool) -> dict[str, Any]:
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
    }
    if not probe:
        return entry
    try:
        backend = info.create(None, None)
    except TesseraError as exc:
        return {**entry, "usable": False, "error": str(exc)}
    ops = [op for op in CORE_OPS if backend.supports(op)]
    for k in entry["kernels"]:
        supported = kernels[(name, k["quant_type"])].supports(backend)
        k["state"] = "active" if supported else "declined by probe"
    return {
        **entry,
        "usable": True,
        "device": backend.device,
        "dtype": backend.dtype,
        "ops": ops,
        "unsupported_ops": [op for op in CORE_OPS if op not in ops],
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


def plugins_report(runtime: Any, probe: bool = True) -> dict[str, Any]:
    """Everything ``tessera plugins`` shows, as plain data (the ``--json`` schema)."""
    # Build every catalogue first: a plugin whose hook raises shows up in failures then.
    kernels = runtime.weight_kernels()
    archs, qtypes, commands = runtime.architectures(), runtime.quant_types(), runtime.commands()
    backends = [
        _backend_entry(name, info, kernels, probe)
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
        "spec_decoders": [
            {"name": name, "description": info.description}
            for name, info in sorted(runtime.spec_decoders().items())
        ],
        "expert_caches": [
            {"name": name, "description": info.description}
            for name, info in runtime.expert_caches().items()
        ],
    }


def run_plugins(args: argparse.Namespace, runtime: Any) -> int:
    if args.json:
        print(json.dumps(plugins_report(runtime, probe=not args.no_probe), indent=2))
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
    for name, info in sorted(runtime.spec_decoders().items()):
        print(f"spec decoder {name}: {info.description}")
    for name, info in runtime.expert_caches().items():
        print(f"expert cache {name}: {info.description}")
    for conflict in runtime.conflicts:
        print(f"conflict: {conflict}")
    return 0
