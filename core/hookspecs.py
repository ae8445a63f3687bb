"""The hook specs: the whole contract between tessera's core and its plugins.

This module is the extension author's reference. A plugin is a module (or object) named by
an entry point in the ``tessera`` group; it declares the plugin-API version it was written
for and implements any of the hooks below with :data:`hookimpl`::

    # my_plugin.py, registered as  [project.entry-points."tessera"] my-thing = "my_plugin"
    from tessera.hookspecs import hookimpl

    TESSERA_PLUGIN_API = 1

    @hookimpl
    def tessera_register_quant_types(register):
        register(QuantType(...))

Catalogue hooks (``tessera_register_*``) receive a ``register`` callback and return nothing;
the core calls each of them once, when the catalogue is first needed. Entry-point modules
should be light: import heavy libraries (torch) inside the objects they register, so that
``tessera plugins`` and ``tessera --help`` stay fast.

Every registered object is plain data or an instance of a documented base class:

- :class:`tessera.backend.BackendInfo` creating a :class:`tessera.backend.Backend`
- :class:`tessera.arch.Architecture`
- :class:`tessera.quant.QuantType`
- :class:`tessera.quant.WeightKernel`
- :class:`tessera.commands.Command`

A later registration under a name already taken is reported as a conflict and ignored, so
the first plugin to claim a name keeps it (built-ins load in entry-point order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from tessera.arch import Architecture
    from tessera.backend import BackendInfo
    from tessera.commands import Command
    from tessera.quant import QuantType, WeightKernel

PROJECT_NAME = "tessera"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
#: Decorator for a plugin's hook implementations.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def tessera_register_backends(register: Callable[[BackendInfo], None]) -> None:
    """Register compute backends.

    Called once, when the runtime first lists or creates a backend. Call
    ``register(BackendInfo(name=..., create=..., description=...))`` for each backend.
    ``create(device)`` is called only when a context is made on that backend; it returns a
    :class:`tessera.backend.Backend` (import torch or other heavy libraries there, not at
    module import). ``device`` is ``None`` for "the best device you have" or a string such
    as ``"cpu"`` / ``"cuda:0"``. A backend that cannot run on this machine raises
    :class:`tessera.errors.UnknownBackendError` from ``create``.
    """


@hookspec
def tessera_register_architectures(register: Callable[[Architecture], None]) -> None:
    """Register model architectures.

    Called once, when the first model is loaded or the catalogue is listed. Call
    ``register(arch)`` with an :class:`tessera.arch.Architecture` instance. Its ``names``
    are the GGUF ``general.architecture`` values it loads and its ``hf_model_types`` the
    ``model_type`` values of Hugging Face ``config.json`` files it loads.
    """


@hookspec
def tessera_register_quant_types(register: Callable[[QuantType], None]) -> None:
    """Register tensor storage types (F32, F16, Q4_0 ...).

    Called once, when the first model file is read or written. Call ``register(qtype)``
    with a :class:`tessera.quant.QuantType`: its GGML type id, block layout and numpy
    ``quantize`` / ``dequantize`` functions, which must be bit-exact with GGUF.
    """


@hookspec
def tessera_register_weight_kernels(register: Callable[[WeightKernel], None]) -> None:
    """Register fast matmul kernels for one quant type on one backend.

    Called once, when a backend first loads a quantized weight. Call
    ``register(WeightKernel(backend=..., quant_type=..., supports=..., load=...))``. The
    backend asks ``supports(backend)`` (the capability probe) before it uses ``load``; when
    no kernel is registered, the probe declines, or the kernel is switched off
    (``TESSERA_DISABLE_KERNELS``), the backend falls back to dequantizing the weight.
    """


@hookspec
def tessera_register_commands(register: Callable[[Command], None]) -> None:
    """Register CLI subcommands (``tessera NAME ...``).

    Called once, when the CLI builds its argument parser. Call
    ``register(Command(name=..., help=..., add_arguments=..., run=...))``.
    ``add_arguments(parser)`` adds the command's flags to an ``argparse`` sub-parser;
    ``run(args, runtime)`` does the work and returns the process exit code.
    """
