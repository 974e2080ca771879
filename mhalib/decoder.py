"""The course's one decoder-only transformer: every trained model is a :class:`Decoder`.

One class, configured by :class:`DecoderConfig`, serves both model families:

* the copy-task model of notebooks 04 and 08 (:func:`mhalib.copytask.model.copy_task_config`):
  attention only (no MLP, no LayerNorm), so every head's contribution to the residual
  stream can be read off directly, and learned positions added to the **queries and keys
  only** (the position-infused attention of Press et al., 2021): a head can *find* by
  position, but what it *moves* is a token;
* the language model of notebooks 05 and 06 (:func:`mhalib.language.language_config`):
  GPT-2's pre-LayerNorm block, ``x = x + drop(attn(ln_1(x)))`` then
  ``x = x + drop(mlp(ln_2(x)))``, positions added into the residual stream.

Each block calls its :class:`~mhalib.attention.GroupedQueryAttention` as a unit
(``self.attn(...)``), so ``num_kv_heads`` makes the same model MHA, GQA or MQA, and every
intervention goes through the attention module's one head contract (``z_hook`` on the
per-head outputs, ``pattern_hook`` on the weights). :meth:`Decoder.forward` offers them
by name: ``ablate=[(layer, head)]`` zeroes heads, ``replace_z`` and ``replace_weights``
patch them, ``record`` keeps what a run computed, ``kv_caches`` decodes with a cache.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from mhalib.attention import GroupedQueryAttention
from mhalib.kv_cache import cached_length
from mhalib.mla import MultiHeadLatentAttention
from mhalib.sliding_window import sliding_window_mask
from mhalib.validation import check_divisible

__all__ = ["DecoderConfig", "make_config", "Block", "Decoder", "check_ablate", "POSITIONS", "INIT_STD"]

INIT_STD = 0.02  # every weight matrix starts as N(0, 0.02^2), as in GPT-2
#: Where the learned positions go: into the residual stream, or into the queries and keys only.
POSITIONS = ("residual", "queries_keys")


@dataclass(frozen=True)
class DecoderConfig:
    """Sizes and shape of a :class:`Decoder`.

    Attributes:
        vocab_size, seq_len: tokens and the longest sequence (learned positions).
        d_model, num_heads: the width and H; ``head_dim = d_model // num_heads``.
        num_kv_heads: g, dividing H (None means H: multi-head attention).
        num_layers: blocks.
        mlp: a GELU MLP of width ``4 d_model`` after each attention (False: attention only).
        layer_norm: pre-LayerNorm before each sub-layer and at the end (False: none).
        positions: ``"residual"`` or ``"queries_keys"`` (see the module docstring).
        dropout: on what each sub-layer adds to the residual stream, and on the embeddings.
        mlp_width: the MLP's hidden width (None: ``4 d_model``); a model with fewer attention
            parameters can get them back here, to compare variants at one parameter budget.
        window: sliding-window attention: each query sees its last ``window`` positions,
            itself included (:func:`mhalib.sliding_window.sliding_window_mask`); None: all.
        num_sinks: with ``window``, the first positions every query also sees (attention sinks).
        kv_lora_rank: multi-head latent attention
            (:class:`~mhalib.mla.MultiHeadLatentAttention`) with a cached latent of this width
            instead of per-head keys and values (None: grouped-query attention). Its heads
            have ``head_dim`` numbers without positions and ``rope_head_dim`` rotated ones
            for queries and keys, and ``head_dim`` for values.
        rope_head_dim: with ``kv_lora_rank``: the rotated part of each query and of the key
            that all heads share (even).
    """

    vocab_size: int
    seq_len: int
    d_model: int = 64
    num_heads: int = 4
    num_kv_heads: int | None = None
    num_layers: int = 2
    mlp: bool = True
    layer_norm: bool = True
    positions: str = "residual"
    dropout: float = 0.0
    mlp_width: int | None = None
    window: int | None = None
    num_sinks: int = 0
    kv_lora_rank: int | None = None
    rope_head_dim: int = 4

    def __post_init__(self):
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        for name in ("vocab_size", "seq_len", "d_model", "num_heads", "num_kv_heads", "num_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int; got {name}={value!r}")
        check_divisible(self.d_model, self.num_heads, "d_model", "num_heads")
        check_divisible(self.num_heads, self.num_kv_heads, "num_heads", "num_kv_heads")
        for name in ("mlp", "layer_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False; got {getattr(self, name)!r}")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {', '.join(map(repr, POSITIONS))}; got {self.positions!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be a float in [0, 1); got {self.dropout!r}")
        for name in ("mlp_width", "window", "kv_lora_rank"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be None or a positive int; got {name}={value!r}")
        if self.mlp_width is not None and not self.mlp:
            raise ValueError("mlp_width sets the MLP's width; this config has mlp=False")
        if isinstance(self.num_sinks, bool) or not isinstance(self.num_sinks, int) or self.num_sinks < 0:
            raise ValueError(f"num_sinks must be an int >= 0; got {self.num_sinks!r}")
        if self.num_sinks and (self.window is None or self.num_sinks >= self.window):
            raise ValueError(f"num_sinks needs a window larger than it (sinks are positions a windowed query "
                             f"sees besides its window); got num_sinks={self.num_sinks}, window={self.window}")
        if self.kv_lora_rank is not None:
            if self.num_kv_heads != self.num_heads:
                raise ValueError(f"kv_lora_rank (latent attention) caches one latent, not K/V heads: leave "
                                 f"num_kv_heads at num_heads; got num_kv_heads={self.num_kv_heads}")
            if self.positions != "residual":
                raise ValueError("kv_lora_rank (latent attention) computes its queries and keys from the stream: "
                                 f"it needs positions='residual'; got {self.positions!r}")
        if isinstance(self.rope_head_dim, bool) or not isinstance(self.rope_head_dim, int) \
                or self.rope_head_dim < 2 or self.rope_head_dim % 2:
            raise ValueError(f"rope_head_dim must be an even int >= 2; got {self.rope_head_dim!r}")

    @property
    def attention(self):
        """``"mla"`` (latent attention) or ``"gqa"`` (MHA, GQA or MQA), with ``"+window"`` when windowed."""
        return ("mla" if self.kv_lora_rank is not None else "gqa") + ("" if self.window is None else "+window")

    @property
    def head_dim(self):
        """d_head = d_model / num_heads."""
        return self.d_model // self.num_heads


def make_config(defaults, **overrides):
    """A :class:`DecoderConfig` from a family's ``defaults`` (a dict of fields) with ``overrides``.

    A field that :class:`DecoderConfig` does not have raises ValueError naming the allowed ones.
    """
    fields = set(DecoderConfig.__dataclass_fields__)
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown config fields {unknown}; allowed: {sorted(fields)}")
    return DecoderConfig(**{**defaults, **overrides})


class Block(nn.Module):
    """One block: causal attention, then (if the config says so) an MLP, each added to the stream.

    Attributes:
        ln_1, ln_2: ``nn.LayerNorm(d_model)``, or None (without ``layer_norm``; ``ln_2`` also without ``mlp``).
        attn: :class:`~mhalib.attention.GroupedQueryAttention` (no biases).
        mlp: ``Linear(d_model, 4 d_model)``, GELU, ``Linear(4 d_model, d_model)``, or None.
        drop: dropout on what each sub-layer adds to the residual stream.
    """

    def __init__(self, config):
        super().__init__()
        c = config
        self.ln_1 = nn.LayerNorm(c.d_model) if c.layer_norm else None
        if c.kv_lora_rank is None:
            self.attn = GroupedQueryAttention(c.d_model, c.num_heads, c.num_kv_heads)
        else:
            self.attn = MultiHeadLatentAttention(c.d_model, c.num_heads, c.kv_lora_rank, c.head_dim,
                                                 c.rope_head_dim, c.head_dim)
        self.window, self.num_sinks = c.window, c.num_sinks
        self.ln_2 = nn.LayerNorm(c.d_model) if c.layer_norm and c.mlp else None
        width = 4 * c.d_model if c.mlp_width is None else c.mlp_width
        self.mlp = nn.Sequential(nn.Linear(c.d_model, width), nn.GELU(),
                                 nn.Linear(width, c.d_model)) if c.mlp else None
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x, pos=None, *, need_weights=False, kv_cache=None, z_hook=None, pattern_hook=None):
        """Args:
            x: residual stream ``(B, N, d_model)``.
            pos: positions ``(N, d_model)`` added to the queries' and keys' input only
                (``positions="queries_keys"``); None when they are in the stream already.
            need_weights: also return the attention weights ``(B, H, N, N_k)``.
            kv_cache, z_hook, pattern_hook: passed to the attention
                (:meth:`~mhalib.attention.GroupedQueryAttention.forward`).

        Returns:
            the new residual stream ``(B, N, d_model)`` (and the weights if asked).
        """
        h = x if self.ln_1 is None else self.ln_1(x)  # (B, N, d_model)
        if isinstance(self.attn, MultiHeadLatentAttention):
            used = [name for name, value in (("kv_cache", kv_cache), ("z_hook", z_hook),
                                             ("pattern_hook", pattern_hook)) if value is not None]
            if used:
                raise ValueError(f"a latent-attention block (kv_lora_rank) takes no {', '.join(used)}: ablation, "
                                 f"patching and KVCache decoding are for grouped-query attention; latent "
                                 f"attention caches with mhalib.mla.MLACache")
            result = self.attn(h, causal=True, need_weights=need_weights)
        else:
            mask = None
            if self.window is not None:
                n = x.shape[1]
                n_k = n + (0 if kv_cache is None else len(kv_cache))
                mask = sliding_window_mask(n, self.window, n_k, num_sinks=self.num_sinks, device=x.device)
            # the band mask is causal already (and SDPA takes a mask or is_causal, not both)
            result = self.attn(h, causal=mask is None, attn_mask=mask, need_weights=need_weights, kv_cache=kv_cache,
                               qk_input=None if pos is None else h + pos, z_hook=z_hook, pattern_hook=pattern_hook)
        out, weights = result if need_weights else (result, None)  # out: (B, N, d_model)
        x = x + self.drop(out)  # (B, N, d_model)
        if self.mlp is not None:
            x = x + self.drop(self.mlp(x if self.ln_2 is None else self.ln_2(x)))  # (B, N, d_model)
        return (x, weights) if need_weights else x


def _is_index(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def check_ablate(ablate, num_layers, num_heads, what="ablate"):
    """Validate a list of ``(layer, head)`` pairs (ints, NumPy ints included); returns ``{layer: [heads]}``.

    Raises ``ValueError`` naming the argument (``what``) and the valid ranges for anything else.
    """
    if ablate is None:
        return {}
    if isinstance(ablate, tuple) and len(ablate) == 2 and all(_is_index(v) for v in ablate):
        raise ValueError(f"{what} must be a list of (layer, head) pairs; got the single pair {ablate!r}: "
                         f"write [{ablate!r}]")
    by_layer = {}
    try:
        pairs = list(ablate)
    except TypeError:
        raise ValueError(f"{what} must be a list of (layer, head) pairs; got {ablate!r}") from None
    for pair in pairs:
        ok = isinstance(pair, (tuple, list)) and len(pair) == 2 and all(_is_index(v) for v in pair)
        if not ok or not 0 <= pair[0] < num_layers or not 0 <= pair[1] < num_heads:
            raise ValueError(f"{what} holds (layer, head) pairs with layer in 0 .. {num_layers - 1} and "
                             f"head in 0 .. {num_heads - 1}; got {pair!r}")
        by_layer.setdefault(int(pair[0]), []).append(int(pair[1]))
    return by_layer


class Decoder(nn.Module):
    """Decoder-only transformer: embed (+ positions), ``num_layers`` blocks, (LayerNorm,) unembed.

    Args:
        config: a :class:`DecoderConfig` (or pass its fields as keywords).

    Seed with ``torch.manual_seed`` before constructing it (or use a family's ``new_model``):
    every weight matrix and embedding starts as N(0, 0.02^2) (``INIT_STD``, GPT-2's choice),
    biases at 0, LayerNorms at weight 1 and bias 0. A seed gives the weights it has always
    given: the modules are built, and drawn, in the order the shipped runs used.

    Attributes:
        embed: ``nn.Embedding(vocab_size, d_model)``.
        pos: ``nn.Embedding(seq_len, d_model)``, learned positions.
        blocks: ``nn.ModuleList`` of :class:`Block`.
        ln_f: ``nn.LayerNorm(d_model)``, or None (without ``layer_norm``).
        unembed: ``nn.Linear(d_model, vocab_size, bias=False)``.
        metadata: what a checkpoint was saved with (:func:`mhalib.checkpoints.load_model`).
    """

    def __init__(self, config=None, **kwargs):
        super().__init__()
        if config is None:
            config = DecoderConfig(**kwargs)
        elif kwargs:
            raise ValueError(f"pass either a DecoderConfig or keywords, not both; got extra {sorted(kwargs)}")
        if not isinstance(config, DecoderConfig):
            raise ValueError(f"config must be a DecoderConfig; got {type(config).__name__}")
        self.config = c = config
        self.metadata = {}
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        # The copy-task runs created their positions as zeros (no draw) and drew them below with
        # everything else; the language runs drew them at creation too. Kept, so seeds still match.
        blank = torch.zeros(c.seq_len, c.d_model) if c.positions == "queries_keys" else None
        self.pos = nn.Embedding(c.seq_len, c.d_model, _weight=blank)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.num_layers))
        self.ln_f = nn.LayerNorm(c.d_model) if c.layer_norm else None
        self.unembed = nn.Linear(c.d_model, c.vocab_size, bias=False)
        drawn = [m for m in self.modules() if isinstance(m, (nn.Linear, nn.Embedding))]
        if c.positions == "queries_keys":  # ... and drew them first
            drawn.insert(0, drawn.pop(drawn.index(self.pos)))
        for module in drawn:
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    @property
    def num_layers(self):
        """The number of blocks."""
        return self.config.num_layers

    @property
    def num_heads(self):
        """The number of attention heads per block."""
        return self.config.num_heads

    def _hooks(self, layer, zero, patches, z_hook, record):
        """The attention's ``(z_hook, pattern_hook)`` for one layer: patch, zero, the user's hook, record."""
        new_z, new_w = patches.get(("z", layer)), patches.get(("weights", layer))
        heads_off = zero.get(layer)

        def on_z(z):  # (B, H, N, d_head)
            if new_z:
                z = z.clone()
                for head, value in new_z.items():
                    z[:, head] = value
            if heads_off:
                keep = torch.ones(z.shape[1], 1, 1, dtype=z.dtype, device=z.device)  # (H, 1, 1)
                keep[heads_off] = 0.0
                z = z * keep  # (B, H, N, d_head): the chosen heads contribute nothing
            if z_hook is not None:
                changed = z_hook(layer, z)
                z = z if changed is None else changed
            if record is not None:
                record["z"] = z
            return z

        def on_weights(weights):  # (B, H, N, N_k)
            if new_w:
                weights = weights.clone()
                for head, value in new_w.items():
                    weights[:, head] = value
            if record is not None:
                record["weights"] = weights
            return weights if new_w else None

        wants_z = new_z or heads_off or z_hook is not None or record is not None
        return (on_z if wants_z else None), (on_weights if new_w or record is not None else None)

    def forward(self, tokens, *, return_weights=False, ablate=None, z_hook=None, replace_z=None,
                replace_weights=None, record=None, kv_caches=None):
        """Next-token logits.

        Args:
            tokens: ``(B, N)`` int64 with ``N <= seq_len``.
            return_weights: also return every layer's attention weights.
            ablate: list of ``(layer, head)`` pairs whose outputs ``z`` are zeroed.
            z_hook: optional ``fn(layer, z) -> z`` on each layer's per-head outputs
                ``(B, H, N, d_head)`` before ``o_proj`` (after ``replace_z`` and ``ablate``).
            replace_z: optional dict ``(layer, head) -> (B, N, d_head)``: replace that head's
                output (activation patching; a mean over items is a mean ablation).
            replace_weights: optional dict ``(layer, head) -> (B, N, N)``: that head attends
                with these weights (attention-pattern patching); its values are this run's.
            record: optional dict; filled with ``"z"`` ``(B, L, H, N, d_head)`` and
                ``"weights"`` ``(B, L, H, N, N)`` of this run (the inputs of a patch).
            kv_caches: optional list of one :class:`~mhalib.kv_cache.KVCache` per layer
                (:func:`mhalib.generate.new_caches`): the tokens continue what the caches
                hold (T earlier positions), so they sit at positions T .. T + N - 1. A step
                that fails leaves the caches as they were.

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
        patches = {}
        for name, given in (("z", replace_z), ("weights", replace_weights)):
            if given is not None and not isinstance(given, dict):
                raise ValueError(f"replace_{name} must be a dict (layer, head) -> tensor; got {type(given).__name__}")
            check_ablate(list(given or {}), self.num_layers, self.num_heads, what=f"replace_{name}")
            for (layer, head), value in (given or {}).items():
                patches.setdefault((name, int(layer)), {})[int(head)] = value
        pos = self.pos.weight[start:start + n]  # (N, d_model)
        x = self.embed(tokens)  # (B, N, d_model)
        if self.config.positions == "residual":
            x, pos = x + pos, None  # (B, N, d_model): positions in the stream
        x = self.drop(x)
        all_weights, records = [], []
        try:
            for i, block in enumerate(self.blocks):
                layer_record = {} if record is not None else None
                on_z, on_weights = self._hooks(i, zero, patches, z_hook, layer_record)
                out = block(x, pos, need_weights=return_weights, z_hook=on_z, pattern_hook=on_weights,
                            kv_cache=None if kv_caches is None else kv_caches[i])
                x, w = out if return_weights else (out, None)  # x: (B, N, d_model), w: (B, H, N, T + N)
                all_weights.append(w)
                records.append(layer_record)
        except Exception:
            for cache in kv_caches or []:  # a step that fails leaves the caches as they were
                cache.truncate(min(start, len(cache)))
            raise
        if record is not None:
            record["z"] = torch.stack([r["z"] for r in records], dim=1)  # (B, L, H, N, d_head)
            record["weights"] = torch.stack([r["weights"] for r in records], dim=1)  # (B, L, H, N, N)
        logits = self.unembed(x if self.ln_f is None else self.ln_f(x))  # (B, N, vocab_size)
        if return_weights:
            return logits, torch.stack(all_weights, dim=1)  # (B, L, H, N, N)
        return logits
