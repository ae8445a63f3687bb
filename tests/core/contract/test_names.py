"""The generic executors of tensor name maps and config field maps."""

from types import SimpleNamespace

import attrs
import numpy as np
import pytest

from tessera.contract.names import (
    REQUIRED,
    ConfigField,
    TensorNames,
    default_head_dims,
    fields_from_gguf,
    fields_from_hf,
    fields_to_gguf,
    stacked_experts_from_hf,
    tensors_from_hf,
)
from tessera.errors import ModelFileError


def _double(value, config):
    return value * config.scale


def _negate(value, config):
    return -value


NAMES = TensorNames(
    global_names={"model.embed.weight": "token_embd.weight", "lm_head.weight": "output.weight"},
    layer_names={"attn.q.weight": "attn_q.weight", "norm.weight": "attn_norm.weight"},
    checkpoint="a toy",
    plugin="toy architecture",
    skip_prefixes=("vision.",),
    skip_suffixes=("rotary_emb.inv_freq",),
    transforms={"attn_norm.weight": _double},
    gguf_transforms={"attn_q.weight": _negate},
)


@attrs.frozen
class Toy:
    scale: float = 2.0


def _tensors(*names):
    return {name: np.full(2, float(i + 1)) for i, name in enumerate(names)}


def test_global_and_layer_names_become_gguf_names_in_checkpoint_order():
    hf = _tensors("model.layers.3.attn.q.weight", "model.embed.weight", "lm_head.weight")
    got = [name for name, _ in tensors_from_hf(NAMES, Toy(), hf, for_gguf=False)]
    assert got == ["blk.3.attn_q.weight", "token_embd.weight", "output.weight"]


def test_an_unknown_tensor_is_named_in_the_error():
    hf = _tensors("model.embed.weight", "model.layers.0.mlp.weight")
    with pytest.raises(ModelFileError) as err:
        list(tensors_from_hf(NAMES, Toy(), hf, for_gguf=True))
    assert str(err.value) == (
        "unexpected tensor 'model.layers.0.mlp.weight' in a toy checkpoint; the toy "
        "architecture plugin does not know where it goes"
    )


def test_the_checkpoint_in_the_error_can_be_named_per_call():
    with pytest.raises(ModelFileError, match="in a qwen2 checkpoint"):
        list(tensors_from_hf(NAMES, Toy(), _tensors("x"), False, checkpoint="a qwen2"))


def test_skipped_names_are_never_read():
    class Unreadable(dict):
        def __getitem__(self, name):
            if name != "model.embed.weight":
                raise AssertionError(f"{name} was read")
            return super().__getitem__(name)

    hf = Unreadable(
        _tensors("vision.tower.weight", "model.rotary_emb.inv_freq", "lm_head.weight")
        | _tensors("model.embed.weight")
    )
    got = dict(tensors_from_hf(NAMES, Toy(), hf, False, skip=("lm_head.weight",)))
    assert list(got) == ["token_embd.weight"]


def test_transforms_apply_always_and_gguf_transforms_only_for_gguf():
    hf = _tensors("model.layers.0.norm.weight", "model.layers.0.attn.q.weight")
    runtime = dict(tensors_from_hf(NAMES, Toy(scale=3.0), hf, for_gguf=False))
    gguf = dict(tensors_from_hf(NAMES, Toy(scale=3.0), hf, for_gguf=True))
    np.testing.assert_array_equal(runtime["blk.0.attn_norm.weight"], [3.0, 3.0])
    np.testing.assert_array_equal(runtime["blk.0.attn_q.weight"], [2.0, 2.0])
    np.testing.assert_array_equal(gguf["blk.0.attn_q.weight"], [-2.0, -2.0])


def test_a_prefix_is_removed_before_the_lookup():
    names = attrs.evolve(
        NAMES, global_names={"embed.weight": "token_embd.weight"}, prefixes=("bert.",)
    )
    hf = _tensors("bert.embed.weight", "embed.weight")
    got = [name for name, _ in tensors_from_hf(names, Toy(), hf, False)]
    assert got == ["token_embd.weight", "token_embd.weight"]


@attrs.frozen
class ToyConfig:
    n_embd: int
    head_dim: int
    rms_eps: float
    n_ff: tuple[int, ...]
    softcap: float = 0.0
    tied: bool = False


FIELDS = (
    ConfigField("n_embd", "embedding_length", "hidden_size"),
    ConfigField("head_dim", ("attention.key_length", "attention.value_length"), "head_dim"),
    ConfigField("rms_eps", "attention.layer_norm_rms_epsilon", "rms_norm_eps", float, 1e-5, 1e-6),
    ConfigField("n_ff", "feed_forward_length", (), tuple),
    ConfigField("softcap", "final_logit_softcapping", "softcap", float, 0.0, omit_default=True),
    ConfigField("tied", (), "tie_word_embeddings", bool, False),
)


def test_a_config_round_trips_gguf_metadata():
    config = ToyConfig(n_embd=64, head_dim=16, rms_eps=1e-6, n_ff=(128, 256), softcap=30.0)
    metadata = fields_to_gguf(FIELDS, config, "toy")
    assert metadata == {
        "toy.embedding_length": 64,
        "toy.attention.key_length": 16,
        "toy.attention.value_length": 16,
        "toy.attention.layer_norm_rms_epsilon": 1e-6,
        "toy.feed_forward_length": [128, 256],
        "toy.final_logit_softcapping": 30.0,
    }
    back = ToyConfig(**fields_from_gguf(FIELDS, metadata, "toy"))
    assert back == config
    assert fields_to_gguf(FIELDS, back, "toy") == metadata


def test_a_default_value_is_not_written_when_omit_default_and_read_back():
    config = ToyConfig(n_embd=64, head_dim=16, rms_eps=1e-5, n_ff=(128,))
    metadata = fields_to_gguf(FIELDS, config, "toy")
    assert "toy.final_logit_softcapping" not in metadata
    del metadata["toy.attention.layer_norm_rms_epsilon"]
    assert ToyConfig(**fields_from_gguf(FIELDS, metadata, "toy")) == config


def test_a_missing_required_gguf_key_names_the_key():
    with pytest.raises(ModelFileError, match="lacks 'toy.embedding_length'"):
        fields_from_gguf(FIELDS, {"toy.attention.key_length": 16}, "toy")


def test_hf_fields_take_the_first_present_name_and_their_own_default():
    fields = (
        ConfigField("n_expert", (), ("num_experts", "num_local_experts")),
        ConfigField("rms_eps", "eps", "rms_norm_eps", float, 1e-5, 1e-6),
        ConfigField("tied", (), "tie_word_embeddings", bool, True),
        ConfigField("n_ctx", "context_length", default=REQUIRED),  # GGUF only
    )
    hf = {"num_experts": None, "num_local_experts": 8, "tie_word_embeddings": False}
    assert fields_from_hf(fields, hf) == {"n_expert": 8, "rms_eps": 1e-6, "tied": False}


def test_a_missing_required_hf_field_is_a_model_file_error():
    with pytest.raises(ModelFileError, match="config.json has no 'hidden_size'.* toy model"):
        fields_from_hf(FIELDS, {"model_type": "toy", "head_dim": 16})


def test_unstated_head_dims_default_to_no_gqa_and_n_embd_over_n_head():
    stated = {"n_embd": 64, "n_head": 4, "n_head_kv": 2, "head_dim": 32}
    assert default_head_dims(stated) == stated
    unstated = default_head_dims({"n_embd": 64, "n_head": 4, "n_head_kv": None, "head_dim": None})
    assert (unstated["n_head_kv"], unstated["head_dim"]) == (4, 16)


def test_per_expert_and_fused_hf_experts_stack_alike_and_a_missing_one_is_refused():
    rng = np.random.default_rng(0)
    c = SimpleNamespace(n_expert=3, n_ff_exp=4)
    gate, up, down = (rng.standard_normal(s) for s in ((3, 4, 5), (3, 4, 5), (3, 5, 4)))
    per = {
        f"mlp.experts.{e}.{proj}.weight": w[e]
        for proj, w in (("gate_proj", gate), ("up_proj", up), ("down_proj", down))
        for e in range(3)
    }
    fused = {
        "mlp.experts.gate_up_proj": np.concatenate([gate, up], 1),
        "mlp.experts.down_proj": down,
    }
    want = {"blk.2.ffn_gate_exps.weight": gate, "blk.2.ffn_up_exps.weight": up,
            "blk.2.ffn_down_exps.weight": down}  # fmt: skip
    for hf in (per, fused):
        got = dict(stacked_experts_from_hf(c, 2, {n: n for n in hf}, hf, "toy"))
        assert got.keys() == want.keys()
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value)
    del per["mlp.experts.1.up_proj.weight"]
    with pytest.raises(ModelFileError, match="layer 2 of this toy checkpoint lacks expert tensor"):
        dict(stacked_experts_from_hf(c, 2, {n: n for n in per}, per, "toy"))
