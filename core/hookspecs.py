"""The hook specs: the whole contract between tessera's core and its plugins.

This module is the extension author's reference. A plugin is a module (or object) named by
an entry point in the ``tessera`` group; it declares the plugin-API version it was written
for and implements any of the hooks below with :data:`hookimpl`::

    # my_plugin.py, registered as  [project.entry-points."tessera"] my-thing = "my_plugin"
    from tessera.hookspecs import hookimpl

    TESSERA_PLUGIN_API = 2

    @hookimpl
    def tessera_register_quant_types(register):
        register(QuantType(...))

Catalogue hooks (``tessera_register_*``) receive a ``register`` callback and return nothing;
the core calls each of them once, when the catalogue is first needed. Entry-point modules
should be light: import heavy libraries (torch) inside the objects they register, so that
``tessera plugins`` and ``tessera --help`` stay fast.

Every registered object is plain data or an instance of a documented base class:

- :class:`tessera.contract.backend.BackendInfo` creating a :class:`tessera.contract.backend.Backend`
- :class:`tessera.contract.arch.Architecture`
- :class:`tessera.contract.quant.QuantType`
- :class:`tessera.contract.quant.WeightKernel`
- :class:`tessera.contract.fusion.BlockFusion`
- :class:`tessera.contract.commands.Command`
- :class:`tessera.contract.routes.ServerRoute`
- :class:`tessera.contract.experts.ExpertCacheInfo` creating an expert cache
- :class:`tessera.contract.comm.CommunicatorInfo` creating a
  :class:`tessera.contract.comm.Communicator`
- :class:`tessera.contract.spec.SpecDecoderInfo` creating a
  :class:`tessera.contract.spec.SpecDecoder`
- :class:`tessera.contract.constraints.ConstraintKind` compiling specs into
  :class:`tessera.contract.constraints.Constraint` objects
- :class:`tessera.contract.tokenizer_kind.TokenizerKindInfo` building a
  :class:`tessera.contract.tokenizer_kind.VocabModel`
- :class:`tessera.switches.Switch` (an environment switch)

A later registration under a name already taken is reported as a conflict and ignored, so
the first plugin to claim a name keeps it (built-ins load in entry-point order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from tessera.contract.arch import Architecture
    from tessera.contract.backend import BackendInfo
    from tessera.contract.comm import CommunicatorInfo
    from tessera.contract.commands import Command
    from tessera.contract.constraints import ConstraintKind
    from tessera.contract.experts import ExpertCacheInfo
    from tessera.contract.fusion import BlockFusion
    from tessera.contract.quant import QuantType, WeightKernel
    from tessera.contract.routes import ServerRoute
    from tessera.contract.spec import SpecDecoderInfo
    from tessera.contract.tokenizer_kind import TokenizerKindInfo
    from tessera.switches import Switch

PROJECT_NAME = "tessera"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
#: Decorator for a plugin's hook implementations.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def tessera_register_backends(register: Callable[[BackendInfo], None]) -> None:
    """Register compute backends.

    Called once, when the runtime first lists or creates a backend. Call
    ``register(BackendInfo(name=..., create=..., description=..., priority=...))`` for each
    backend; with no ``--backend`` the highest ``priority`` that can run here is used.
    ``create(device, dtype)`` is called only when a context is made on that backend; it
    returns a :class:`tessera.contract.backend.Backend` (import torch or other heavy
    libraries there, not at module import). ``device`` is ``None`` for "the best device you have" or
    a string such as ``"cpu"`` / ``"cuda:0"``. A backend that cannot run on this machine raises
    :class:`tessera.errors.UnknownBackendError` from ``create``.
    """


@hookspec
def tessera_register_architectures(register: Callable[[Architecture], None]) -> None:
    """Register model architectures.

    Called once, when the first model is loaded or the catalogue is listed. Call
    ``register(arch)`` with an :class:`tessera.contract.arch.Architecture` instance. Its ``names``
    are the GGUF ``general.architecture`` values it loads, its ``hf_model_types`` the
    ``model_type`` values of Hugging Face ``config.json`` files it loads and its
    ``hf_classes`` the ``architectures`` class names that pick it before ``model_type`` does.
    """


@hookspec
def tessera_register_quant_types(register: Callable[[QuantType], None]) -> None:
    """Register tensor storage types (F32, F16, Q4_0 ...).

    Called once, when the first model file is read or written. Call ``register(qtype)``
    with a :class:`tessera.contract.quant.QuantType`: its GGML type id, block layout and numpy
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
def tessera_register_block_fusions(register: Callable[[BlockFusion], None]) -> None:
    """Register whole-block kernels: one kind of block of an architecture on one backend.

    Called once, when the loader first equips a backend. Call
    ``register(BlockFusion(backend=..., block=..., run=..., probe=...))``, ``block`` naming
    the kind of block (:data:`tessera.contract.fusion.LLAMA_DECODER`: a llama-family
    decoder layer for one decode token, described by a
    :class:`tessera.contract.fusion.DecoderBlock`). An architecture asks
    ``backend.fusion(block)`` when it builds its graph; ``probe(backend)`` decides whether
    the fusion serves that backend instance, and ``run`` may still decline one call by
    returning None (the architecture then runs the block's ops).
    """


@hookspec
def tessera_register_commands(register: Callable[[Command], None]) -> None:
    """Register CLI subcommands (``tessera NAME ...``).

    Called once, when the CLI builds its argument parser. Call
    ``register(Command(name=..., help=..., add_arguments=..., run=...))``.
    ``add_arguments(parser)`` adds the command's flags to an ``argparse`` sub-parser;
    ``run(args, runtime)`` does the work and returns the process exit code.
    """


@hookspec
def tessera_register_routes(register: Callable[[ServerRoute], None]) -> None:
    """Register HTTP routes of ``tessera serve`` (the OpenAI API itself is such a plugin).

    Called once, when the server builds its app. Call
    ``register(ServerRoute(path=..., endpoint=..., methods=(...)))`` with a
    :class:`tessera.contract.routes.ServerRoute`. ``endpoint(request)`` is an async Starlette
    handler; ``request.app.state.tessera`` is the :class:`tessera.plugins.server.state.ServerState`
    (model, tokenizer, slot engine, settings). Routes need the API key (when one is set)
    unless ``public=True``. Raise :class:`tessera.contract.routes.ApiError` to answer with an
    OpenAI-shaped error JSON and its HTTP status.
    """


@hookspec
def tessera_register_expert_caches(register: Callable[[ExpertCacheInfo], None]) -> None:
    """Register expert caches: fast tiers for the experts of offloaded MoE layers.

    Called once, when the first mixture-of-experts model is loaded with offloaded experts
    (``--cpu-moe`` / ``-ncmoe N``) and a cache budget (``--moe-cache-mib N`` > 0). Call
    ``register(ExpertCacheInfo(name=..., create=..., description=...))``; the loader uses
    the first registered cache. ``create(budget_bytes)`` returns a cache object with:

    - ``wrap(slow) -> ExpertWeights``: serve one layer's experts; ``slow`` is a
      :class:`tessera.contract.experts.SlowExperts` (``slow.load(e)`` converts expert ``e`` from
      the file to the backend's form, ``slow.key`` names the layer and that form);
      ``get(ids)`` of the returned object must give exactly what ``slow.load`` gives;
    - ``stats() -> dict``: at least ``hits``, ``misses``, ``evictions``, ``bytes_moved``
      (backend-form bytes brought in by misses), ``bytes_used`` and ``budget_bytes``;
    - ``clear()``: drop every cached expert (counters stay).

    The cache must never hold more than ``budget_bytes``; an expert larger than the whole
    budget is used and dropped. With ``--moe-cache-shared`` one cache object serves every
    model and backend the runtime loads, so keys must include ``slow.key``.
    """


@hookspec
def tessera_register_communicators(register: Callable[[CommunicatorInfo], None]) -> None:
    """Register communicators: collectives between the ranks of a tensor-parallel group.

    Called once, when a tensor-parallel run (``tessera run --tp N`` or ``--tp-rank``)
    forms its group, and by ``tessera plugins``. Call
    ``register(CommunicatorInfo(name=..., create=..., probe=..., description=...,
    collective=..., max_ranks=...))`` with a :class:`tessera.contract.comm.CommunicatorInfo`:

    - ``probe(device) -> CommunicatorProbe``: whether this rank can use the communicator
      with its backend on ``device`` (``"cpu"``, ``"cuda:0"``) and which transports it
      offers (``features``, e.g. ``("gloo", "nccl")``). Cheap, no network; it runs on every
      rank and rank 0 collects the answers before anything connects.
    - ``create(spec) -> Communicator``: join the group described by a
      :class:`tessera.contract.comm.GroupSpec` (rank, world size, rank 0's host and the
      port rank 0 chose for this communicator, timeout, device, the features every rank
      offered). Block until all ranks are connected; raise
      :class:`tessera.contract.comm.CommunicatorError` if that does not happen within
      ``spec.timeout_s``. The returned :class:`tessera.contract.comm.Communicator`
      implements ``all_reduce``, ``all_gather``, ``broadcast`` and ``barrier`` on numpy
      arrays and torch tensors, each bounded by the timeout (a dead or hung peer must
      raise ``CommunicatorError``, never block forever), and ``close``.
    - ``collective=True`` marks a library of real collectives; such communicators are
      preferred. ``max_ranks`` caps the group size (``None``: any).

    Selection (:func:`tessera.plugins.tensor_parallel.choice.choose_communicator`): the one named by
    ``--communicator`` / ``TESSERA_COMMUNICATOR``; else the first collective one every rank
    can use; else a point-to-point one whose ``max_ranks`` covers the group; else the
    group is refused with an error naming what each rank lacks.
    """


@hookspec
def tessera_register_spec_decoders(register: Callable[[SpecDecoderInfo], None]) -> None:
    """Register speculative decoders: drafters that propose tokens for the target to check.

    Called once, when a generation asks for one (``tessera run --spec-type NAME``) or
    ``tessera plugins`` lists them. Call
    ``register(SpecDecoderInfo(name=..., create=..., description=...))`` with a
    :class:`tessera.contract.spec.SpecDecoderInfo`; ``name`` is the ``--spec-type`` value.

    ``create(target_ctx, params, runtime)`` receives the target's
    :class:`tessera.engine.context.Context`, the :class:`tessera.contract.spec.SpecParams`
    (``--draft-max``, ``--draft-min``, ``--draft-p-min``, ``-md``,
    ``--spec-draft-n-ubatch``) and the :class:`tessera.plugin_manager.Runtime` (to load a draft
    model), and returns a :class:`tessera.contract.spec.SpecDecoder`. When the drafter
    cannot serve this target (no MTP layers, a draft model with another vocabulary, no
    ``-md``), raise :class:`tessera.errors.TesseraError` with a sentence naming what is
    missing and the way out.

    The core's loop (:func:`tessera.engine.generate.generate` with a ``decoder``) calls
    ``decoder.begin(prompt, seq_id)`` once the prompt is in the target's cache, then
    before each target batch ``decoder.draft(history, n_max) ->``
    :class:`tessera.contract.spec.Draft` (at most ``n_max`` tokens; with their proposal
    distributions if they were sampled), and after it ``decoder.accepted(history,
    n_drafted, n_accepted)``. The loop verifies the draft, keeps the accepted prefix plus
    one token of the target's and removes rejected cells from the target's KV cache; a
    drafter with a cache of its own removes its rejected cells itself (``KVCache.seq_rm``).
    Whatever the drafter proposes, the output equals the target's alone (greedy) or is
    distributed like it (sampling); a drafter only changes the speed.
    """


@hookspec
def tessera_register_constraints(register: Callable[[ConstraintKind], None]) -> None:
    """Register output-constraint kinds: languages a generation can be kept inside.

    Called once, when a request first asks for a constraint (the server's
    ``response_format``, ``grammar``, ``json_schema``, ``guided_*``, Ollama's ``format``,
    a forced tool call) or ``tessera plugins`` lists them. Call ``register(ConstraintKind(
    name=..., compile=..., description=...))`` (:class:`tessera.contract.constraints.
    ConstraintKind`); the server asks for ``json_object``, ``json_schema``, ``gbnf``,
    ``regex``, ``choice`` and ``tool_call`` (spec ``{"tools": [...], "family": name}``).

    ``compile(spec, tokenizer)`` gets the kind's spec and the model's tokenizer and
    returns a factory of :class:`tessera.contract.constraints.Constraint` objects, one per
    generation; a refused spec raises ``ConstraintSpecError`` (the server's 400). The
    engine calls ``sample(sampler, logits, history)`` on the constrained slot's row only,
    then ``accept(token)``, and stops once ``complete``; no speculation for such requests.
    """


@hookspec
def tessera_register_tokenizer_kinds(register: Callable[[TokenizerKindInfo], None]) -> None:
    """Register tokenizer kinds: tokenizers for vocabularies the core does not run.

    Called once, when a vocabulary's ``tokenizer.ggml.model`` is none of the core's
    (``llama``, ``gpt2`` and the BPE models, ``bert``), and by ``tessera plugins``. Call
    ``register(TokenizerKindInfo(...))`` (:mod:`tessera.contract.tokenizer_kind`);
    ``models`` are the ``tokenizer.ggml.model`` values it runs (``("t5",)``).
    ``build(Vocabulary)`` gets the flags, tokens, ids, scores, attributes, special ids and
    ``tokenizer.*`` metadata, and returns an object with ``encode(text, after_special) ->
    list[int]`` for raw text (special tokens already cut out), or raises
    :class:`tessera.errors.TokenizerError` naming what the vocabulary lacks. ``render(text,
    attr) -> bytes`` renders one token when the kind stores tokens its own way (None:
    SentencePiece's ``▁`` and ``<0xXX>``); ``framed``, ``add_bos``, ``add_eos`` and
    ``special_ids`` are llama.cpp's defaults for the kind. An unregistered model is refused.
    """


@hookspec
def tessera_register_switches(register: Callable[[Switch], None]) -> None:
    """Register the plugin's environment switches (``TESSERA_*`` variables).

    Called once, when ``tessera plugins --switches`` (or ``--json``) lists them; reading a
    switch never needs the catalogue. Call ``register(switch)`` with each module-level
    :class:`tessera.switches.Switch` the plugin declares: its variable name, one line
    saying what it does, its kind (``off``, ``on``, ``names``, ``choice``, ``name``,
    ``number``) and default. Read it only through :mod:`tessera.switches` (``flag``,
    ``names``, ``text``, ``number``) and choose a switched path with
    :func:`tessera.switches.choose`, which records why. A name already declared (by the
    core or an earlier plugin) is reported as a conflict and ignored.
    """
