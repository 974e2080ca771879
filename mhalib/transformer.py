"""A small attention-only transformer, built from mhalib's grouped-query attention.

The model of notebooks 04 and 08 (after Elhage et al., 2021, and Olsson et al., 2022):

* token embedding -> residual stream ``(B, N, d_model)``;
* ``num_layers`` attention layers, each adding its output to the residual stream;
  no MLP, no LayerNorm, so every head's contribution can be read off directly;
* learned positions added to the **queries and keys only**: the residual stream and
  the values carry token identity alone, so a head can *find* by position but what it
  *moves* is a token (this keeps the copy task honest: position is never copied);
* a linear unembedding to logits ``(B, N, vocab_size)``.

Each layer is a :class:`mhalib.attention.GroupedQueryAttention` (``q_proj``,
``k_proj``, ``v_proj``, ``o_proj``, ``attend``), so ``num_kv_heads`` turns the same
model into GQA (``1 < g < H``) or MQA (``g = 1``).

Interpretability hooks: ``forward(..., return_weights=True)`` returns every layer's
attention weights; ``z_hook(layer, z)`` may replace the per-head outputs
``z`` ``(B, H, N, d_head)`` before ``o_proj`` (zeroing a head is an ablation).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from mhalib.attention import GroupedQueryAttention
from mhalib.kv_cache import cached_length
from mhalib.validation import check_divisible

__all__ = [
    "ToyConfig",
    "AttentionLayer",
    "ToyTransformer",
    "save_checkpoint",
    "load_checkpoint",
    "load_pretrained",
    "write_weights",
    "read_weights",
    "PRETRAINED",
]

DATA_DIR = Path(__file__).resolve().parent / "data"
PRETRAINED = "induction_2layer"  # the model trained in notebook 04
INIT_STD = 0.02  # every weight starts as N(0, 0.02^2), as in GPT-2


@dataclass(frozen=True)
class ToyConfig:
    """Sizes of a :class:`ToyTransformer` (defaults: the model of notebook 04)."""

    vocab_size: int = 64
    seq_len: int = 32
    d_model: int = 64
    num_heads: int = 4
    num_kv_heads: int = 4
    num_layers: int = 2

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "d_model", "num_heads", "num_kv_heads", "num_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int; got {name}={value!r}")
        check_divisible(self.d_model, self.num_heads, "d_model", "num_heads")
        check_divisible(self.num_heads, self.num_kv_heads, "num_heads", "num_kv_heads")

    @property
    def head_dim(self):
        """d_head = d_model / num_heads."""
        return self.d_model // self.num_heads


class AttentionLayer(nn.Module):
    """One causal attention layer whose queries and keys see positions, values do not.

    ``self.attn`` is a :class:`~mhalib.attention.GroupedQueryAttention`; this layer only
    decides what goes into its projections.
    """

    def __init__(self, d_model, num_heads, num_kv_heads):
        super().__init__()
        self.attn = GroupedQueryAttention(d_model, num_heads, num_kv_heads)

    def forward(self, x, pos, *, z_hook=None, need_weights=False, kv_cache=None):
        """Args:
            x: residual stream ``(B, N, d_model)``.
            kv_cache: optional :class:`~mhalib.kv_cache.KVCache`: the new keys and values are
                appended and the queries attend to everything cached (causal, bottom right).
            pos: positional embeddings ``(N, d_model)``, added to the query/key input.
            z_hook: optional ``fn(z) -> z`` on the per-head outputs ``(B, H, N, d_head)``.
            need_weights: also return the attention weights ``(B, H, N, N)``.

        Returns:
            the layer's output ``(B, N, d_model)`` (to add to the residual stream), and
            the weights if asked.
        """
        a = self.attn
        b, n, d = x.shape
        qk_in = x + pos  # (B, N, d_model): positions for finding, not for moving
        q = a.q_proj(qk_in).view(b, n, a.num_heads, a.head_dim).transpose(1, 2)  # (B, H, N, d_head)
        k = a.k_proj(qk_in).view(b, n, a.num_kv_heads, a.head_dim).transpose(1, 2)  # (B, g, N, d_head)
        v = a.v_proj(x).view(b, n, a.num_kv_heads, a.head_dim).transpose(1, 2)  # (B, g, N, d_head)
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)  # (B, g, T + N, d_head)
        result = a.attend(q, k, v, causal=True, need_weights=need_weights)
        z, weights = result if need_weights else (result, None)  # z: (B, H, N, d_head)
        if z_hook is not None:
            z = z_hook(z)
        out = a.o_proj(z.transpose(1, 2).reshape(b, n, d))  # (B, N, d_model)
        return (out, weights) if need_weights else out


class ToyTransformer(nn.Module):
    """Attention-only transformer: embed, ``num_layers`` x (x += attention(x)), unembed.

    Args:
        config: a :class:`ToyConfig` (or pass its fields as keywords).

    Every weight starts as N(0, 0.02^2) (``INIT_STD``, GPT-2's choice): the model begins
    close to a uniform guess, and the copy task then shows a plateau before the phase
    change (notebook 04). Seed with ``torch.manual_seed`` before constructing it, or use
    :func:`mhalib.training.new_model`.

    Attributes:
        embed: ``nn.Embedding(vocab_size, d_model)``.
        pos: ``(seq_len, d_model)`` learned positions (queries and keys only).
        layers: ``nn.ModuleList`` of :class:`AttentionLayer`.
        unembed: ``nn.Linear(d_model, vocab_size, bias=False)``.
    """

    def __init__(self, config=None, **kwargs):
        super().__init__()
        if config is None:
            config = ToyConfig(**kwargs)
        elif kwargs:
            raise ValueError(f"pass either a ToyConfig or keywords, not both; got extra {sorted(kwargs)}")
        self.config = config
        c = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = nn.Parameter(torch.zeros(c.seq_len, c.d_model))
        self.layers = nn.ModuleList(
            AttentionLayer(c.d_model, c.num_heads, c.num_kv_heads) for _ in range(c.num_layers)
        )
        self.unembed = nn.Linear(c.d_model, c.vocab_size, bias=False)
        for p in self.parameters():  # GPT-2's initialisation: small, so training starts near uniform
            nn.init.normal_(p, mean=0.0, std=INIT_STD)

    def forward(self, tokens, *, return_weights=False, z_hook=None, kv_caches=None):
        """Next-token logits.

        Args:
            tokens: ``(B, N)`` int64 with ``N <= seq_len``.
            kv_caches: optional list of one :class:`~mhalib.kv_cache.KVCache` per layer
                (:func:`mhalib.generate.new_caches`): the tokens continue what they hold.
            return_weights: also return the attention weights of every layer.
            z_hook: optional ``fn(layer_index, z) -> z`` applied to each layer's per-head
                outputs ``z`` ``(B, H, N, d_head)`` before ``o_proj``.

        Returns:
            logits ``(B, N, vocab_size)``, or ``(logits, weights)`` with weights
            ``(B, num_layers, H, N, N)`` (``(B, num_layers, H, N, T + N)`` after T cached positions).
        """
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype != torch.long:
            got = f"shape {tuple(tokens.shape)}, dtype {tokens.dtype}" if isinstance(tokens, torch.Tensor) \
                else type(tokens).__name__
            raise ValueError(f"tokens must be an int64 tensor (B, N); got {got}")
        n = tokens.shape[1]
        start = cached_length(kv_caches, self.config.num_layers)
        if start + n > self.config.seq_len:
            raise ValueError(f"sequences of {start + n} tokens are longer than seq_len={self.config.seq_len}"
                             + (f" ({start} cached + {n} new)" if start else ""))
        x = self.embed(tokens)  # (B, N, d_model)
        pos = self.pos[start:start + n]  # (N, d_model)
        all_weights = []
        for i, layer in enumerate(self.layers):
            hook = None if z_hook is None else (lambda z, i=i: z_hook(i, z))
            cache = None if kv_caches is None else kv_caches[i]
            if return_weights:
                out, w = layer(x, pos, z_hook=hook, need_weights=True, kv_cache=cache)  # w: (B, H, N, N)
                all_weights.append(w)
            else:
                out = layer(x, pos, z_hook=hook, kv_cache=cache)
            x = x + out  # (B, N, d_model)
        logits = self.unembed(x)  # (B, N, vocab_size)
        if return_weights:
            return logits, torch.stack(all_weights, dim=1)  # (B, L, H, N, N)
        return logits


def _paths(path):
    path = Path(path)
    stem = path.with_suffix("") if path.suffix in (".pt", ".json") else path
    return stem.with_suffix(".pt"), stem.with_suffix(".json")


def write_weights(model, path, **metadata):
    """Save a model as ``PATH.pt`` (its state dict) and ``PATH.json`` (config + metadata).

    The one format of the course's shipped models (this module's and
    :mod:`mhalib.language`'s): ``model.config`` must be a dataclass.

    Returns:
        the ``.pt`` path.
    """
    pt, js = _paths(path)
    pt.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    torch.save(state, pt)
    js.write_text(json.dumps({"config": asdict(model.config), **metadata}, indent=1, sort_keys=True) + "\n")
    return pt


def read_weights(path, what="checkpoint", hint=""):
    """``(state_dict, metadata)`` written by :func:`write_weights`; a ValueError names what is missing."""
    pt, js = _paths(path)
    if not pt.exists() or not js.exists():
        raise ValueError(f"no {what} at {pt.with_suffix('')} (need both .pt and .json){hint}")
    return torch.load(pt, weights_only=True), json.loads(js.read_text())


def save_checkpoint(model, path, **metadata):
    """Save ``model`` as ``PATH.pt`` (its state dict) and ``PATH.json`` (config + metadata).

    Args:
        model: a :class:`ToyTransformer`.
        path: file name with or without ``.pt``/``.json``.
        **metadata: JSON-serialisable facts to keep with it (seed, steps, task, ...).

    Returns:
        the ``.pt`` path.
    """
    if not isinstance(model, ToyTransformer):
        raise ValueError(f"save_checkpoint saves a ToyTransformer; got {type(model).__name__}")
    return write_weights(model, path, **metadata)


def load_checkpoint(path):
    """Load a model saved by :func:`save_checkpoint`; returns ``(model, metadata)``.

    The model is in eval mode; ``metadata`` is the JSON dict (``config`` included).
    """
    state, meta = read_weights(path)
    model = ToyTransformer(ToyConfig(**meta["config"]))
    model.load_state_dict(state)
    model.eval()
    return model, meta


def load_pretrained(name=PRETRAINED):
    """The model trained in notebook 04 (shipped in ``mhalib/data``); returns ``(model, metadata)``."""
    available = sorted(p.stem for p in DATA_DIR.glob("*.pt") if not p.stem.startswith("language"))
    if name not in available:
        raise ValueError(f"no shipped checkpoint named {name!r}; available: {available}")
    return load_checkpoint(DATA_DIR / name)
