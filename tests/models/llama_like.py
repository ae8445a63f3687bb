"""The llama-like families' test models and the oracle their parity tests share.

Each :class:`Fixture` is a random-weight checkpoint that ``transformers`` makes from the
family's own config class (tiny dims, float32), committed under ``tests/data/arch/<name>/``
as the HF folder (``hf/``) and the GGUF llama.cpp's own converter wrote from it
(``<name>.gguf``); ``tests/data/arch/make_fixtures_llama_like.py`` makes both from the specs
below. Tests never regenerate them: the committed safetensors are the weights, so a change
in how transformers initializes models cannot change what is compared.

The oracle is transformers itself, loading the committed HF folder in float32.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
import torch
import transformers

from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd.convert import convert_hf_to_gguf
from tessera.testing.arch import relative_error

DATA = Path(__file__).resolve().parents[1] / "data"
ARCH_DIR = DATA / "arch"
TEMPLATE_DIR = DATA / "chat-templates"
RUNTIME = Runtime()
BACKENDS = ["numpy"] + (["torch"] if "torch" in RUNTIME.backends() else [])
#: Tokens of the byte-level BPE the fixtures carry (trained on pydoc topics; see
#: tessera.testing.models.train_fallback_tokenizer): small, so each file stays small.
VOCAB_SIZE = 320
#: The prompt is longer than every sliding window below (4 and 6).
N_PROMPT, N_PREDICT = 12, 8
SMALL = {"n_embd": 64, "n_head": 4, "n_head_kv": 2, "n_ff": 64, "head_dim": 16}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
#: GLM's special tokens (its chat template's and those llama.cpp's converter looks up).
GLM_TOKENS = ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")
#: GLM-4.5's router: sigmoid over 6 experts in 2 groups (the best one eligible), top-2
#: renormalized and scaled, one shared expert, a dense first block, Q/K norms.
GLM4_MOE = {
    "n_routed_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "n_shared_experts": 1, "n_group": 2, "topk_group": 1, "norm_topk_prob": True,
    "routed_scaling_factor": 2.5, "first_k_dense_replace": 1, "use_qk_norm": True,
    "attention_bias": True, "num_nextn_predict_layers": 1,
}  # fmt: skip


@attrs.frozen
class Fixture:
    """One committed test model: how transformers makes it and what llama.cpp calls it."""

    name: str
    hf_type: str
    #: ``general.architecture`` of the GGUF llama.cpp's converter writes.
    arch: str
    template: str
    seed: int
    dims: dict[str, Any]
    hf: dict[str, Any] = attrs.field(factory=dict)
    tied: bool = False
    #: llama.cpp's Phi-3 converter takes a GPT-2-style vocabulary only under this class.
    tokenizer_class: str = "PreTrainedTokenizerFast"
    #: Config fields the GGUF llama.cpp writes does not keep (the model it describes is
    #: transformers' with these overrides): Mistral's sliding window.
    llama_cpp_drops: dict[str, Any] = attrs.field(factory=dict)
    #: Special tokens added to the vocabulary (llama.cpp's GLM converter looks them up).
    special_tokens: tuple[str, ...] = ()
    #: MTP blocks appended after the main ones, as GLM-4.5 checkpoints carry them
    #: (transformers makes and loads the model without them).
    nextn: int = 0

    @property
    def folder(self) -> Path:
        return ARCH_DIR / self.name

    @property
    def hf_dir(self) -> Path:
        return self.folder / "hf"

    @property
    def gguf(self) -> Path:
        return self.folder / f"{self.name}.gguf"


FIXTURES = {
    f.name: f
    for f in (
        # Mistral 7B v0.1: llama with a sliding window (shorter than the prompt)
        Fixture(
            "mistral", "mistral", "llama", "mistralai-Mistral-Nemo-Instruct-2407", 11,
            SMALL | {"n_layer": 2}, {"sliding_window": 4},
            llama_cpp_drops={"sliding_window": None},
        ),
        # Ministral 3: YaRN (a quarter of the original context, ramped) and the attention
        # temperature past each 8 positions
        Fixture(
            "ministral3", "ministral3", "mistral3", "mistralai-Ministral-3-14B-Reasoning-2512",
            12, SMALL | {"n_layer": 2},
            {
                "max_position_embeddings": 64,
                "rope_parameters": YARN | {
                    "rope_theta": 10000.0, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                    "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1,
                },
            },
        ),
        # SmolLM3: layer 3 of 4 without RoPE, tied embeddings
        Fixture(
            "smollm3", "smollm3", "smollm3", "HuggingFaceTB-SmolLM3-3B", 13,
            SMALL | {"n_layer": 4}, {}, tied=True,
        ),
        # Granite 3: every multiplier away from 1 (attention's from 1/sqrt(head_dim))
        Fixture(
            "granite", "granite", "granite", "ibm-granite-granite-3.3-2B-Instruct", 14,
            SMALL | {"n_layer": 2},
            {
                "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                "logits_scaling": 8.0, "attention_multiplier": 0.1,
            },
        ),
        Fixture(
            "granitemoe", "granitemoe", "granitemoe", "ibm-granite-granite-3.3-2B-Instruct", 15,
            SMALL | {"n_layer": 2, "n_ff": 32},
            {
                "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                "logits_scaling": 8.0, "attention_multiplier": 0.1,
                "num_local_experts": 4, "num_experts_per_tok": 2,
            },
        ),
        Fixture(
            "olmo2", "olmo2", "olmo2", "allenai-OLMo-2-1124-13B-Instruct", 16,
            SMALL | {"n_layer": 2}, {},
        ),
        # Phi-3 mini: fused tensors and a sliding window (which llama.cpp ignores)
        Fixture(
            "phi3", "phi3", "phi3", "microsoft-Phi-3.5-mini-instruct", 17,
            SMALL | {"n_layer": 2},
            {"sliding_window": 6, "max_position_embeddings": 64,
             "original_max_position_embeddings": 64},
            tokenizer_class="GPT2Tokenizer",
        ),
        # Phi-4-mini: LongRoPE (short factors up to 16 positions, long ones past) on three
        # quarters of each head, tied embeddings
        Fixture(
            "phi4mini", "phi3", "phi3", "microsoft-Phi-4-mini-instruct", 18,
            SMALL | {"n_layer": 2},
            {
                "max_position_embeddings": 64, "original_max_position_embeddings": 16,
                "rope_parameters": {
                    "rope_type": "longrope", "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.75, "original_max_position_embeddings": 16,
                    "short_factor": [1.0, 1.2, 1.5, 2.0, 2.5, 3.0],
                    "long_factor": [1.5, 2.0, 3.0, 4.5, 6.0, 8.0],
                },
            },
            tied=True, tokenizer_class="GPT2Tokenizer",
        ),
        # RoPE scaling of the llama arch as llama.cpp's converter writes it
        Fixture(
            "llama-linear", "llama", "llama", "meta-llama-Llama-3.2-3B-Instruct", 19,
            SMALL | {"n_layer": 2}, {"rope_parameters": {"rope_type": "linear", "factor": 2.0}},
        ),
        Fixture(
            "llama-yarn", "llama", "llama", "meta-llama-Llama-3.2-3B-Instruct", 20,
            SMALL | {"n_layer": 2},
            {"max_position_embeddings": 64, "rope_parameters": YARN | {"rope_theta": 10000.0}},
        ),
        # GLM-4-0414: four norms a block, fused gate/up, normal-mode RoPE on half of each
        # head, Q/K/V biases
        Fixture(
            "glm4", "glm4", "glm4", "GLM-4.6", 22, SMALL | {"n_layer": 2},
            {"attention_bias": True}, special_tokens=GLM_TOKENS,
        ),
        # GLM-4.5: DeepSeek-style experts after a dense block, NeoX RoPE on half of each
        # head, and its MTP block
        Fixture(
            "glm4moe", "glm4_moe", "glm4moe", "GLM-4.6", 23, SMALL | {"n_layer": 2}, GLM4_MOE,
            special_tokens=GLM_TOKENS, nextn=1,
        ),
        Fixture(
            "llama-llama3", "llama", "llama", "meta-llama-Llama-3.1-8B-Instruct", 21,
            SMALL | {"n_layer": 2},
            {
                "rope_parameters": {
                    "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
            },
        ),
    )
}  # fmt: skip


#: Where a test reads a model from: the HF folder, llama.cpp's GGUF of it, tessera's.
SOURCES = ("hf", "llama.cpp", "tessera")


class Family:
    """One fixture's three model files and transformers' answers, each made once."""

    def __init__(self, f: Fixture, tmp: Path) -> None:
        self.f, self.tmp = f, tmp
        self._answers: dict[tuple, tuple[np.ndarray, list[int]]] = {}

    @functools.cached_property
    def tessera_gguf(self) -> Path:
        return convert_hf_to_gguf(self.f.hf_dir, self.tmp / f"{self.f.name}.gguf", RUNTIME, "f32")

    def path(self, source: str) -> Path:
        return {"hf": self.f.hf_dir, "llama.cpp": self.f.gguf}.get(source) or self.tessera_gguf

    def expected(
        self, source: str, n_prompt: int = N_PROMPT, n_predict: int = N_PREDICT
    ) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """The prompt, and transformers' logits and greedy tokens for the model ``source``
        describes."""
        config = self.f.llama_cpp_drops if source == "llama.cpp" else {}
        key = (tuple(config.items()), n_prompt, n_predict)
        if key not in self._answers:
            self._answers[key] = transformers_answers(
                self.f, prompt_of(n_prompt), n_predict, **config
            )
        return prompt_of(n_prompt), *self._answers[key]


def gguf_disagreements(ours: Path, theirs: Path) -> list[str]:
    """What of llama.cpp's GGUF (``theirs``) tessera's (``ours``) lacks or states otherwise:
    every ``{arch}.*`` key (floats as the float32 GGUF stores) and every tensor (its values
    within float32 rounding). Keys tessera adds are not counted."""
    from tessera.files.gguf import read_gguf

    a, b = read_gguf(ours), read_gguf(theirs)
    arch = b.metadata["general.architecture"]
    out = [] if a.metadata["general.architecture"] == arch else ["general.architecture"]
    for key, value in b.metadata.items():
        if key.startswith(arch + ".") and not _same(a.metadata.get(key), value):
            out.append(f"{key}: {a.metadata.get(key)!r} != {value!r}")
    out += [f"tensor {n} missing" for n in b.tensors if n not in a.tensors]
    out += [f"tensor {n} not in llama.cpp's" for n in a.tensors if n not in b.tensors]
    for name in set(a.tensors) & set(b.tensors):
        x, y = (np.frombuffer(g.tensors[name].data.tobytes(), np.float32) for g in (a, b))
        if a.tensors[name].shape != b.tensors[name].shape or not np.allclose(x, y, 1e-6, 0):
            out.append(f"tensor {name} differs")
    return out


def _same(ours: Any, theirs: Any) -> bool:
    if isinstance(theirs, float):
        return ours is not None and np.float32(ours) == np.float32(theirs)
    return ours == theirs


def prompt_of(n_tokens: int = N_PROMPT) -> np.ndarray:
    return np.random.default_rng(7).integers(0, VOCAB_SIZE, n_tokens)


def transformers_answers(
    f: Fixture, prompt: np.ndarray, n_predict: int = N_PREDICT, **config: Any
) -> tuple[np.ndarray, list[int]]:
    """transformers' logits of every prompt row and its greedy continuation; ``config``
    overrides fields of the checkpoint's config (``sliding_window=None`` ...)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        f.hf_dir, dtype=torch.float32, **config
    )
    model.generation_config.eos_token_id = None  # tessera's generate has no EOG here either
    ids = torch.tensor(prompt)[None]
    with torch.no_grad():
        logits = model(ids).logits[0].numpy()
        out = model.generate(ids, max_new_tokens=n_predict, do_sample=False, pad_token_id=0)
    return logits, out[0, len(prompt) :].tolist()


def load(path: Path, backend: str) -> Any:
    return load_model(path, RUNTIME, RUNTIME.create_backend(backend, dtype="f32"))


def tessera_answers(
    path: Path, backend: str, prompt: np.ndarray, n_predict: int = N_PREDICT, n_ctx: int = 64
) -> tuple[np.ndarray, list[int]]:
    """tessera's logits of every prompt row (one pass) and its greedy continuation through
    the KV cache, in a context of ``n_ctx`` cells."""
    model = load(path, backend)
    logits = Context(model, ContextParams(n_ctx=n_ctx)).decode(
        Batch.for_sequence(prompt, logits="all")
    )
    ctx = Context(model, ContextParams(n_ctx=n_ctx))
    sampler = Sampler(SamplerParams(temperature=0))
    return logits, list(generate(ctx, prompt.tolist(), n_predict, sampler))


def family_parity(
    fixtures: Mapping[str, Fixture], names: Sequence[str], tol: float = 1e-5
) -> tuple[Any, Any, Any]:
    """The module-scoped ``family`` fixture (each of ``names`` in turn) and the two tests
    every family's parity module runs on it, to assign to those three names: tessera gives
    transformers' logits for every prompt row (relative error <= ``tol``) and its greedy
    continuation, from each source on each backend; and ``tessera convert`` writes what
    llama.cpp's converter writes."""

    @pytest.fixture(scope="module", params=list(names), name="family")
    def family(request: Any, tmp_path_factory: Any) -> Family:
        return Family(fixtures[request.param], tmp_path_factory.mktemp(request.param))

    @pytest.mark.parametrize("backend", BACKENDS)
    @pytest.mark.parametrize("source", SOURCES)
    def test_logits_and_greedy_tokens_match_transformers(
        family: Family, source: str, backend: str
    ) -> None:
        prompt, logits, greedy = family.expected(source)
        got, tokens = tessera_answers(family.path(source), backend, prompt)
        assert got.shape == logits.shape
        assert relative_error(got, logits) <= tol
        assert tokens == greedy

    def test_tessera_writes_what_llama_cpp_writes(family: Family) -> None:
        assert gguf_disagreements(family.tessera_gguf, family.f.gguf) == []

    return (
        family,
        test_logits_and_greedy_tokens_match_transformers,
        test_tessera_writes_what_llama_cpp_writes,
    )
