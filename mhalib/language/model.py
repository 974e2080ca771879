"""A small decoder-only transformer for the grammar's language, and its shipped weights.

The standard GPT-2 block at a size a laptop trains in minutes:

* token embedding + **learned positions**, added into the residual stream ``(B, N, d_model)``;
* ``num_layers`` **pre-LayerNorm** blocks: ``x = x + drop(attn(ln_1(x)))``, then
  ``x = x + drop(mlp(ln_2(x)))``; the attention is mhalib's
  :class:`~mhalib.attention.GroupedQueryAttention` (``q_proj``, ``k_proj``, ``v_proj``,
  ``o_proj``; with ``num_kv_heads == num_heads`` it is multi-head attention), causal;
  the MLP is ``Linear(d_model, 4 d_model)``, GELU, ``Linear(4 d_model, d_model)``;
* a final LayerNorm and a linear unembedding to ``(B, N, vocab_size)`` logits.

Interpretability hooks, as in :class:`mhalib.transformer.ToyTransformer`:
``forward(..., return_weights=True)`` also returns every layer's attention weights, and
``ablate=[(layer, head), ...]`` zeroes those heads' outputs ``z`` ``(B, H, N, d_head)``
*before* ``o_proj`` mixes the heads, which removes exactly their contribution.

:func:`load_language_model` loads the model notebook 05 studies (``mhalib/data``);
``python -m mhalib.language train`` trains it again from its seed.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from mhalib.attention import GroupedQueryAttention, repeat_kv
from mhalib.kv_cache import cached_length
from mhalib.transformer import read_weights, write_weights
from mhalib.language.grammar import SEQ_LEN, VOCAB
from mhalib.validation import check_divisible

__all__ = [
    "LanguageConfig",
    "Block",
    "LanguageModel",
    "check_ablate",
    "save_language_model",
    "load_language_model",
    "DATA_DIR",
    "SHIPPED",
    "SHIPPED_SEEDS",
    "shipped_path",
]

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
SHIPPED = "language_model"  # mhalib/data/language_model.pt and .json (seed 0)
#: The seeds of the recipe that ship: ``language_model`` (seed 0), ``language_model_seed1`` ...
SHIPPED_SEEDS = (0, 1, 2, 3, 4)


def shipped_path(seed=0):
    """Where seed ``seed`` of the recipe ships (without the ``.pt``/``.json`` ending)."""
    if seed not in SHIPPED_SEEDS:
        raise ValueError(f"seed {seed!r} does not ship; the shipped seeds are {SHIPPED_SEEDS}")
    return DATA_DIR / (SHIPPED if seed == 0 else f"{SHIPPED}_seed{seed}")
INIT_STD = 0.02  # GPT-2's initialisation


@dataclass(frozen=True)
class LanguageConfig:
    """Sizes of a :class:`LanguageModel` (defaults: the shipped model).

    ``head_dim`` is ``d_model // num_heads``: at fixed ``d_model`` more heads are narrower.
    """

    vocab_size: int = len(VOCAB)
    seq_len: int = SEQ_LEN
    d_model: int = 64
    num_heads: int = 4
    num_kv_heads: int | None = None  # None: num_heads (multi-head attention)
    num_layers: int = 2
    dropout: float = 0.0

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "d_model", "num_heads", "num_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int; got {name}={value!r}")
        check_divisible(self.d_model, self.num_heads, "d_model", "num_heads")
        if self.num_kv_heads is not None:
            check_divisible(self.num_heads, self.num_kv_heads, "num_heads", "num_kv_heads")
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be a float in [0, 1); got {self.dropout!r}")

    @property
    def head_dim(self):
        """d_head = d_model / num_heads."""
        return self.d_model // self.num_heads

    @property
    def kv_heads(self):
        """g, the number of key/value heads."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads


class Block(nn.Module):
    """One pre-LayerNorm transformer block: causal attention, then an MLP, each residual.

    Attributes:
        ln_1, ln_2: ``nn.LayerNorm(d_model)``.
        attn: :class:`~mhalib.attention.GroupedQueryAttention` (no biases).
        mlp: ``Linear(d_model, 4 d_model)``, GELU, ``Linear(4 d_model, d_model)``.
        drop: dropout on what each sub-layer adds to the residual stream.
    """

    def __init__(self, d_model, num_heads, num_kv_heads, dropout=0.0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = GroupedQueryAttention(d_model, num_heads, num_kv_heads)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
        self.drop = nn.Dropout(dropout)

    def forward(self, x, *, zero_heads=(), need_weights=False, replace_z=None, replace_weights=None,
                record=None, kv_cache=None):
        """Args:
            x: residual stream ``(B, N, d_model)``.
            kv_cache: optional :class:`~mhalib.kv_cache.KVCache` of this layer: the new keys
                and values are appended, and the N new queries attend to everything cached
                (the causal mask aligned to the bottom right). Weights are then ``(B, H, N, T + N)``.
            zero_heads: heads whose output ``z`` is set to zero before ``o_proj``.
            need_weights: also return the attention weights ``(B, H, N, N)``.
            replace_z: optional dict head -> ``(B, N, d_head)``: that head's output ``z``
                is replaced (activation patching; a mean over items is a mean ablation).
            replace_weights: optional dict head -> ``(B, N, N)``: that head attends with
                these weights instead of its own (attention-pattern patching); its values
                are still this run's.
            record: optional dict; if given, ``record["z"]`` gets every head's output
                ``(B, H, N, d_head)`` and ``record["weights"]`` the weights ``(B, H, N, N)``.

        Returns:
            the new residual stream ``(B, N, d_model)`` (and the weights if asked).
        """
        a = self.attn
        b, n, d = x.shape
        q, k, v = a.project(self.ln_1(x))  # (B, H, N, d_head), (B, g, N, d_head), (B, g, N, d_head)
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)  # (B, g, T + N, d_head): what earlier steps cached, and these
        explicit = need_weights or replace_weights or record is not None
        result = a.attend(q, k, v, causal=True, need_weights=explicit)
        z, weights = result if explicit else (result, None)  # z: (B, H, N, d_head)
        if replace_weights:
            weights = weights.clone()
            for head, w in replace_weights.items():
                weights[:, head] = w
            v_all = repeat_kv(v, a.num_heads // a.num_kv_heads)  # (B, H, N, d_head)
            z = weights @ v_all  # (B, H, N, d_head)
        if replace_z:
            z = z.clone()
            for head, value in replace_z.items():
                z[:, head] = value
        if zero_heads:
            keep = torch.ones(a.num_heads, 1, 1, dtype=z.dtype, device=z.device)  # (H, 1, 1)
            keep[list(zero_heads)] = 0.0
            z = z * keep  # (B, H, N, d_head): the chosen heads contribute nothing
        if record is not None:
            record["z"], record["weights"] = z, weights
        x = x + self.drop(a.o_proj(z.transpose(1, 2).reshape(b, n, d)))  # (B, N, d_model)
        x = x + self.drop(self.mlp(self.ln_2(x)))  # (B, N, d_model)
        return (x, weights) if need_weights else x


def _is_index(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def check_ablate(ablate, num_layers, num_heads):
    """Validate a list of ``(layer, head)`` pairs (ints, NumPy ints included); returns ``{layer: [heads]}``.

    Raises ``ValueError`` naming the valid ranges for anything else.
    """
    if ablate is None:
        return {}
    if isinstance(ablate, tuple) and len(ablate) == 2 and all(_is_index(v) for v in ablate):
        raise ValueError(f"ablate must be a list of (layer, head) pairs; got the single pair {ablate!r}: "
                         f"write [{ablate!r}]")
    by_layer = {}
    try:
        pairs = list(ablate)
    except TypeError:
        raise ValueError(f"ablate must be a list of (layer, head) pairs; got {ablate!r}") from None
    for pair in pairs:
        ok = isinstance(pair, (tuple, list)) and len(pair) == 2 and all(_is_index(v) for v in pair)
        if not ok or not 0 <= pair[0] < num_layers or not 0 <= pair[1] < num_heads:
            raise ValueError(f"ablate holds (layer, head) pairs with layer in 0 .. {num_layers - 1} and "
                             f"head in 0 .. {num_heads - 1}; got {pair!r}")
        by_layer.setdefault(int(pair[0]), []).append(int(pair[1]))
    return by_layer


class LanguageModel(nn.Module):
    """Decoder-only transformer: embed + positions, ``num_layers`` blocks, LayerNorm, unembed.

    Args:
        config: a :class:`LanguageConfig` (or pass its fields as keywords).

    Seed with ``torch.manual_seed`` before constructing it: every weight matrix starts
    as N(0, 0.02^2), LayerNorms at weight 1 and bias 0, biases at 0.

    Attributes:
        embed: ``nn.Embedding(vocab_size, d_model)``.
        pos: ``nn.Embedding(seq_len, d_model)``, learned positions.
        blocks: ``nn.ModuleList`` of :class:`Block`.
        ln_f: ``nn.LayerNorm(d_model)``.
        unembed: ``nn.Linear(d_model, vocab_size, bias=False)``.
    """

    def __init__(self, config=None, **kwargs):
        super().__init__()
        if config is None:
            config = LanguageConfig(**kwargs)
        elif kwargs:
            raise ValueError(f"pass either a LanguageConfig or keywords, not both; got extra {sorted(kwargs)}")
        self.config = c = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = nn.Embedding(c.seq_len, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c.d_model, c.num_heads, c.kv_heads, c.dropout) for _ in range(c.num_layers))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.unembed = nn.Linear(c.d_model, c.vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    @property
    def num_layers(self):
        """The number of transformer layers."""
        return self.config.num_layers

    @property
    def num_heads(self):
        """The number of attention heads per layer."""
        return self.config.num_heads

    def forward(self, tokens, *, return_weights=False, ablate=None, replace_z=None, replace_weights=None,
                record=None, kv_caches=None):
        """Next-token logits.

        Args:
            tokens: ``(B, N)`` int64 with ``N <= seq_len``.
            kv_caches: optional list of one :class:`~mhalib.kv_cache.KVCache` per layer
                (:func:`mhalib.generate.new_caches`): the tokens continue what the caches
                hold (T earlier positions), so they sit at positions T .. T + N - 1.
            return_weights: also return every layer's attention weights.
            ablate: list of ``(layer, head)`` pairs whose outputs are zeroed.
            replace_z: optional dict ``(layer, head) -> (B, N, d_head)``: replace that head's
                output (activation patching, mean ablation).
            replace_weights: optional dict ``(layer, head) -> (B, N, N)``: that head attends
                with these weights (attention-pattern patching).
            record: optional dict; filled with ``"z"`` ``(B, L, H, N, d_head)`` and
                ``"weights"`` ``(B, L, H, N, N)`` of this run (the inputs of a patch).

        Returns:
            logits ``(B, N, vocab_size)``, or ``(logits, weights)`` with weights
            ``(B, num_layers, H, N, N)`` (``(B, num_layers, H, N, T + N)`` after T cached positions).
        """
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype != torch.long:
            got = f"shape {tuple(tokens.shape)}, dtype {tokens.dtype}" if isinstance(tokens, torch.Tensor) \
                else type(tokens).__name__
            raise ValueError(f"tokens must be an int64 tensor (B, N); got {got}")
        n = tokens.shape[1]
        start = cached_length(kv_caches, self.num_layers)
        if start + n > self.config.seq_len:
            raise ValueError(f"sequences of {start + n} tokens are longer than seq_len={self.config.seq_len}"
                             + (f" ({start} cached + {n} new)" if start else ""))
        if replace_weights and kv_caches is not None:
            raise ValueError("replace_weights patches whole attention maps (B, N, N): run the full sequence "
                             "without kv_caches to patch them")
        zero = check_ablate(ablate, self.num_layers, self.num_heads)
        by_layer = {}
        for name, given in (("z", replace_z), ("weights", replace_weights)):
            check_ablate(list(given or {}), self.num_layers, self.num_heads)
            for (layer, head), value in (given or {}).items():
                by_layer.setdefault((name, int(layer)), {})[int(head)] = value
        x = self.drop(self.embed(tokens) + self.pos.weight[start:start + n])  # (B, N, d_model)
        all_weights, records = [], []
        try:
            for i, block in enumerate(self.blocks):
                layer_record = {} if record is not None else None
                out = block(x, zero_heads=zero.get(i, ()), need_weights=return_weights,
                            replace_z=by_layer.get(("z", i)), replace_weights=by_layer.get(("weights", i)),
                            record=layer_record, kv_cache=None if kv_caches is None else kv_caches[i])
                x, w = out if return_weights else (out, None)  # x: (B, N, d_model), w: (B, H, N, N + T)
                all_weights.append(w)
                records.append(layer_record)
        except Exception:
            for cache in kv_caches or []:  # a step that fails leaves the caches as they were
                cache.truncate(min(start, len(cache)))
            raise
        if record is not None:
            record["z"] = torch.stack([r["z"] for r in records], dim=1)  # (B, L, H, N, d_head)
            record["weights"] = torch.stack([r["weights"] for r in records], dim=1)  # (B, L, H, N, N)
        logits = self.unembed(self.ln_f(x))  # (B, N, vocab_size)
        if return_weights:
            return logits, torch.stack(all_weights, dim=1)  # (B, L, H, N, N)
        return logits


def save_language_model(model, path, **metadata):
    """Save ``model`` as ``PATH.pt`` (its state dict) and ``PATH.json`` (config + metadata).

    Args:
        model: a :class:`LanguageModel`.
        path: file name with or without ``.pt``/``.json``.
        **metadata: JSON-serialisable facts to keep with it (recipe, measured numbers).

    Returns:
        the ``.pt`` path.
    """
    if not isinstance(model, LanguageModel):
        raise ValueError(f"save_language_model saves a LanguageModel; got {type(model).__name__}")
    return write_weights(model, path, **metadata)


def load_language_model(path=None, *, seed=0):
    """A shipped model of notebook 05 (or one saved by :func:`save_language_model`).

    Args:
        path: None for a shipped model, else a file name with or without ``.pt``/``.json``.
        seed: which shipped seed of the recipe (:data:`SHIPPED_SEEDS`; 0, the default, is
            the model the notebook shows first).

    Returns:
        a :class:`LanguageModel` in eval mode; its ``metadata`` attribute holds the JSON
        dict (config, training recipe, the numbers measured when it was saved).
    """
    state, meta = read_weights(shipped_path(seed) if path is None else path, "language model",
                               "; train one with: python -m mhalib.language train")
    model = LanguageModel(LanguageConfig(**meta["config"]))
    model.load_state_dict(state)
    model.eval()
    model.metadata = meta
    return model
