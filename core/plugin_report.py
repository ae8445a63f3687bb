"""``tessera plugins``: what is installed, what each backend supports, which paths are active."""

from __future__ import annotations

import argparse
from typing import Any

from tessera.backend import CORE_OPS
from tessera.errors import TesseraError


def add_plugins_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-probe",
        action="store_true",
        help="do not create backends to ask which ops they support (faster)",
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
        for (kb, qname), kernel in sorted(kernels.items()):
            if kb == name:
                state = "active" if kernel.supports(backend) else "declined by probe"
                lines.append(f"    kernel {qname}: {state} {kernel.description}".rstrip())
    return lines


def run_plugins(args: argparse.Namespace, runtime: Any) -> int:
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
    for conflict in runtime.conflicts:
        print(f"conflict: {conflict}")
    return 0
