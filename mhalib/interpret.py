"""Finding what heads do: attention-pattern scores and head ablation.

Scores take attention weights ``(H, N, N)`` or ``(B, H, N, N)`` (rows are queries,
as everywhere in mhalib) as NumPy arrays or torch tensors and return one number per
head, a NumPy array ``(H,)``:

* :func:`previous_token_score`: mean weight on the token one back;
* :func:`offset_score`: the same for any fixed distance back;
* :func:`induction_score`: weight on the token *after* an earlier occurrence of the
  current token (the induction pattern of Olsson et al., 2022);
* :func:`duplicate_token_score`: weight on earlier occurrences of the current token.

:func:`ablate_head` zeroes one head's output (or several); :func:`ablation_table`
measures what that costs a trained :class:`~mhalib.transformer.ToyTransformer`.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "previous_token_score",
    "offset_score",
    "induction_score",
    "duplicate_token_score",
    "ablate_head",
    "ablation_hook",
    "attention_weights",
    "head_scores",
    "ablation_table",
]


def _as_numpy(x, name):
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
    try:
        return np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an array of numbers; got {type(x).__name__}") from None


def _weights_4d(weights):
    w = _as_numpy(weights, "weights")
    if w.ndim == 3:
        w = w[None]  # (1, H, N, N)
    if w.ndim != 4 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"weights must be (H, N, N) or (B, H, N, N); got shape {np.shape(weights)}")
    return w  # (B, H, N, N)


def _tokens_2d(tokens, w):
    t = np.asarray(tokens.detach().cpu().numpy() if hasattr(tokens, "detach") else tokens)
    if t.ndim == 1:
        t = t[None]  # (1, N)
    b, _, n, _ = w.shape
    if t.ndim != 2 or t.shape[1] != n or t.shape[0] not in (1, b):
        raise ValueError(
            f"tokens must be (N,) or (B, N) matching weights (B={b}, H, N={n}, N={n}); "
            f"got shape {np.shape(tokens)}"
        )
    return np.broadcast_to(t, (b, n))  # (B, N)


def offset_score(weights, offset):
    """Mean attention weight on the key ``offset`` positions back.

    Args:
        weights: ``(H, N, N)`` or ``(B, H, N, N)``.
        offset: distance back, ``1 <= offset < N``.

    Returns:
        ``(H,)``: the mean of ``weights[..., i, i - offset]`` over the batch and the
        query positions ``i = offset .. N - 1``.
    """
    w = _weights_4d(weights)  # (B, H, N, N)
    n = w.shape[-1]
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or not 1 <= offset < n:
        raise ValueError(f"offset must be an int in 1 .. {n - 1} for N={n}; got {offset!r}")
    i = np.arange(offset, n)
    return w[:, :, i, i - offset].mean(axis=(0, 2))  # (H,)


def previous_token_score(weights):
    """Mean attention weight on the previous token.

    Args:
        weights: ``(H, N, N)`` or ``(B, H, N, N)`` with ``N >= 2``.

    Returns:
        ``(H,)``: the mean of ``weights[..., i, i - 1]`` over the batch and the query
        positions ``1 .. N - 1`` (position 0 has no previous token). 1 for a head that
        always looks one back, about ``1 / i`` on average for a uniform causal head.
    """
    w = _weights_4d(weights)
    if w.shape[-1] < 2:
        raise ValueError(f"previous_token_score needs N >= 2 positions; got N={w.shape[-1]}")
    return offset_score(w, 1)


def _earlier_matches(t):
    """``(B, N, N)`` bool: ``[b, i, j]`` True when ``j < i`` and ``t[b, j] == t[b, i]``."""
    n = t.shape[1]
    same = t[:, :, None] == t[:, None, :]  # (B, N, N)
    return same & np.tri(n, n, -1, dtype=bool)[None]  # (B, N, N): keys strictly before the query


def _masked_mean(w, target, queries):
    """Mean over the selected queries of the total weight on the target keys; ``(H,)``."""
    total = (w * target[:, None]).sum(axis=-1)  # (B, H, N)
    count = queries.sum()
    if count == 0:
        return np.zeros(w.shape[1])
    return (total * queries[:, None]).sum(axis=(0, 2)) / count  # (H,)


def induction_score(weights, tokens):
    """Attention on the token that followed an earlier occurrence of the current token.

    For a query i whose token appeared before, at every position j < i with
    ``tokens[j] == tokens[i]``, an induction head looks at ``j + 1`` (what came next
    last time) to predict what comes next now.

    Args:
        weights: ``(H, N, N)`` or ``(B, H, N, N)``.
        tokens: ``(N,)`` or ``(B, N)`` token ids of the same sequences.

    Returns:
        ``(H,)``: the mean, over all queries (batch and positions) whose token occurred
        earlier, of the total weight on the positions ``j + 1``. Zeros if no token repeats.
    """
    w = _weights_4d(weights)  # (B, H, N, N)
    match = _earlier_matches(_tokens_2d(tokens, w))  # (B, N, N)
    target = np.zeros_like(match)
    target[:, :, 1:] = match[:, :, :-1]  # (B, N, N): j + 1 for every match j
    return _masked_mean(w, target, match.any(axis=-1))


def duplicate_token_score(weights, tokens):
    """Attention on earlier occurrences of the current token.

    Args:
        weights: ``(H, N, N)`` or ``(B, H, N, N)``.
        tokens: ``(N,)`` or ``(B, N)``.

    Returns:
        ``(H,)``: the mean, over queries whose token occurred earlier, of the total weight
        on the positions j < i holding the same token. Zeros if no token repeats.
    """
    w = _weights_4d(weights)
    match = _earlier_matches(_tokens_2d(tokens, w))  # (B, N, N)
    return _masked_mean(w, match, match.any(axis=-1))


def ablate_head(z, head):
    """A copy of the per-head outputs ``z`` with one head (or several) set to zero.

    Args:
        z: ``(..., H, N, d_head)``, NumPy array or torch tensor (the head outputs before
            they are merged and projected by ``W_O``).
        head: an int in ``0 .. H - 1``, or a sequence of them.

    Returns:
        same type and shape as ``z``; ``z`` itself is left unchanged.
    """
    if not hasattr(z, "ndim") or z.ndim < 3:
        raise ValueError(f"z must be an array (..., H, N, d_head) with at least 3 dimensions; "
                         f"got shape {getattr(z, 'shape', type(z).__name__)}")
    num_heads = z.shape[-3]
    heads = [head] if isinstance(head, (int, np.integer)) and not isinstance(head, bool) else head
    try:
        heads = list(heads)
    except TypeError:
        raise ValueError(f"head must be an int or a list of ints; got {head!r}") from None
    for h in heads:
        if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or not 0 <= h < num_heads:
            raise ValueError(f"head must be in 0 .. {num_heads - 1} (z has H={num_heads}); got {h!r}")
    out = z.clone() if hasattr(z, "clone") else np.array(z, copy=True)
    out[..., heads, :, :] = 0
    return out


def ablation_hook(layer, heads):
    """A ``z_hook`` for :class:`~mhalib.transformer.ToyTransformer` that zeroes ``heads`` in ``layer``."""
    def hook(layer_index, z):
        return ablate_head(z, heads) if layer_index == layer else z
    return hook


def attention_weights(model, tokens):
    """Every layer's attention weights for ``tokens`` ``(B, N)``: NumPy ``(B, L, H, N, N)``."""
    import torch

    with torch.no_grad():
        _, weights = model(tokens, return_weights=True)  # (B, L, H, N, N)
    return weights.numpy()


def head_scores(model, tokens):
    """Previous-token, induction and duplicate-token scores of every head.

    Args:
        model: a :class:`~mhalib.transformer.ToyTransformer`.
        tokens: ``(B, N)`` int64 tensor.

    Returns:
        dict name -> ``(L, H)`` NumPy array, names ``"previous"``, ``"induction"``,
        ``"duplicate"`` (ready for ``mhalib.plots.attention_grid(..., scores=...)``).
    """
    w = attention_weights(model, tokens)  # (B, L, H, N, N)
    t = tokens.numpy()
    layers = range(w.shape[1])
    return {
        "previous": np.stack([previous_token_score(w[:, l]) for l in layers]),  # (L, H)
        "induction": np.stack([induction_score(w[:, l], t) for l in layers]),  # (L, H)
        "duplicate": np.stack([duplicate_token_score(w[:, l], t) for l in layers]),  # (L, H)
    }


def ablation_table(model, task=None, *, seed=12345, batch_size=1024):
    """Loss and accuracy with each head zeroed in turn.

    Returns:
        list of dicts ``{"layer", "head", "loss", "accuracy"}``; the first row is the
        intact model (``layer`` and ``head`` None), then one row per head.
    """
    from mhalib.training import evaluate

    rows = [{"layer": None, "head": None, **evaluate(model, task, seed=seed, batch_size=batch_size)}]
    cfg = model.config
    for layer in range(cfg.num_layers):
        for head in range(cfg.num_heads):
            result = evaluate(model, task, seed=seed, batch_size=batch_size,
                              z_hook=ablation_hook(layer, head))
            rows.append({"layer": layer, "head": head, **result})
    return rows
