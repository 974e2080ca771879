"""Sliding-window attention (Longformer, Mistral): each token sees the last W positions.

Convention: a window of W means query position p sees keys ``p - W + 1 .. p``, itself
included: W keys, which is what a cache of W slots can hold (Hugging Face's Mistral masks the
same way). Mistral's paper counts the window as positions ``i - W .. i``.

* :func:`sliding_window_mask`: the band mask, bool, ``True`` = may attend.
* :class:`RollingKVCache`: W slots overwritten in turn (the "rolling buffer cache" of
  Jiang et al. 2023), optionally keeping the first ``num_sinks`` tokens for good
  (attention sinks, Xiao et al. 2023, *Efficient Streaming Language Models with Attention Sinks*).
* :func:`receptive_field`: how far back information can reach through stacked windows.

Shapes: B batch, g key/value heads, d_head per head.
"""

from __future__ import annotations

import torch

from mhalib.attention import grouped_attention

__all__ = ["sliding_window_mask", "visible_positions", "receptive_field", "RollingKVCache"]


def _positive_int(value, name, *, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, int) and not hasattr(value, "__index__"):
        raise ValueError(f"{name} must be an integer; got {value!r}")
    value = int(value)
    if value < (0 if allow_zero else 1):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '>= 1'}; got {name}={value}")
    return value


def visible_positions(position, window, num_sinks=0):
    """The key positions that query ``position`` sees: the sinks, then the last ``window - num_sinks``.

    With ``num_sinks = 0`` this is the plain window ``max(0, p - W + 1) .. p``. With sinks, the
    first ``num_sinks`` positions stay visible and the window of the others shrinks to
    ``W - num_sinks``, so the total stays at most W (what a cache of W slots holds).

    Returns:
        Sorted list of ints.
    """
    position = _positive_int(position, "position", allow_zero=True)
    window = _positive_int(window, "window")
    num_sinks = _positive_int(num_sinks, "num_sinks", allow_zero=True)
    if num_sinks >= window:
        raise ValueError(f"num_sinks must be smaller than window; got num_sinks={num_sinks}, window={window}")
    recent = range(max(0, position - (window - num_sinks) + 1), position + 1)
    return sorted(set(range(min(num_sinks, position + 1))) | set(recent))


def sliding_window_mask(n_q, window, n_k=None, *, num_sinks=0, device=None):
    """Band mask: query i (at position ``n_k - n_q + i``) sees the W keys up to itself.

    Args:
        n_q: queries, the last n_q of n_k positions (bottom-right aligned, as in decoding).
        window: W >= 1; ``window >= n_k`` is the plain causal mask.
        n_k: keys (default n_q).
        num_sinks: the first positions every query also sees (see :func:`visible_positions`).

    Returns:
        ``(n_q, n_k)`` bool tensor, ``True`` where attention is allowed (the convention of
        ``F.scaled_dot_product_attention``).
    """
    n_k = n_q if n_k is None else n_k
    window = _positive_int(window, "window")
    num_sinks = _positive_int(num_sinks, "num_sinks", allow_zero=True)
    if n_q < 1 or n_k < n_q:
        raise ValueError(f"sliding_window_mask needs 1 <= n_q <= n_k; got n_q={n_q}, n_k={n_k}")
    if num_sinks >= window:
        raise ValueError(f"num_sinks must be smaller than window; got num_sinks={num_sinks}, window={window}")
    p = torch.arange(n_k - n_q, n_k, device=device)[:, None]  # (N_q, 1): query positions
    j = torch.arange(n_k, device=device)[None, :]  # (1, N_k): key positions
    recent = (j <= p) & (j > p - (window - num_sinks))  # (N_q, N_k)
    return recent | ((j < num_sinks) & (j <= p))  # (N_q, N_k)


def receptive_field(window, num_layers):
    """Positions the last token of a stack of windowed layers can draw on, itself included.

    Each layer reaches ``window - 1`` positions further back than the one below, so
    ``num_layers * (window - 1) + 1``; in Mistral's count (windows of ``i - W .. i``) that is
    ``num_layers * W`` positions back.
    """
    window = _positive_int(window, "window")
    num_layers = _positive_int(num_layers, "num_layers")
    return num_layers * (window - 1) + 1


class RollingKVCache:
    """A cache of ``window`` slots per sequence, written in turn: position p goes to slot p mod W.

    With ``num_sinks = s`` the first s positions keep slots 0 .. s-1 for good and the others
    roll through the remaining ``W - s`` slots. Memory never grows past W positions, whatever
    the length of the sequence.

    Use::

        cache = RollingKVCache(window=4)
        out = cache.attend(q, k, v)   # q (B, H, N, d), k, v (B, g, N, d): the N newest positions

    :meth:`attend` sees the cached keys and the new ones, masks by position (so that each new
    query sees exactly its window), then stores the new keys and values.

    Attributes:
        positions: ``(W,)`` long tensor, the position held by each slot (-1 = empty).
    """

    def __init__(self, window, num_sinks=0):
        self.window = _positive_int(window, "window")
        self.num_sinks = _positive_int(num_sinks, "num_sinks", allow_zero=True)
        if self.num_sinks >= self.window:
            raise ValueError(f"num_sinks must be smaller than window; got num_sinks={num_sinks}, window={window}")
        self._k = self._v = None
        self.positions = torch.full((self.window,), -1, dtype=torch.long)
        self.seen = 0  # tokens written so far = the position of the next one

    def __repr__(self):
        return f"RollingKVCache(window={self.window}, num_sinks={self.num_sinks}, seen={self.seen})"

    def slot(self, position):
        """The slot that position ``position`` is written to."""
        if position < self.num_sinks:
            return position
        rolling = self.window - self.num_sinks
        return self.num_sinks + (position - self.num_sinks) % rolling

    def write(self, k, v):
        """Store ``k, v`` ``(B, g, N, d)`` at positions ``seen .. seen + N - 1``, one slot each in turn."""
        if k.dim() != 4 or k.shape != v.shape:
            raise ValueError(f"k and v must both be (B, g, N, d_head); got {tuple(k.shape)} and {tuple(v.shape)}")
        b, g, n, d = k.shape
        if self._k is None:
            self._k = k.new_zeros(b, g, self.window, d)  # (B, g, W, d_head)
            self._v = v.new_zeros(b, g, self.window, d)  # (B, g, W, d_head)
        elif (b, g, d) != (self._k.shape[0], self._k.shape[1], self._k.shape[3]):
            raise ValueError(f"this cache holds (B, g, W, d_head) = {tuple(self._k.shape)}; got a step of {tuple(k.shape)}")
        for i in range(n):  # the last of a long prompt overwrite the first: in turn, as in decoding
            s = self.slot(self.seen)
            self._k[:, :, s] = k[:, :, i]
            self._v[:, :, s] = v[:, :, i]
            self.positions[s] = self.seen
            self.seen += 1

    @property
    def keys(self):
        """``(B, g, W, d_head)``, slot order (not position order); empty slots hold zeros."""
        return self._k

    @property
    def values(self):
        """``(B, g, W, d_head)``, slot order (not position order); empty slots hold zeros."""
        return self._v

    @property
    def nbytes(self):
        """Bytes of both buffers: fixed at W slots once the first token is written."""
        return 0 if self._k is None else 2 * self._k.numel() * self._k.element_size()

    def attend(self, q, k, v):
        """Attention of the N new queries over their windows, then the new k, v are stored.

        Args:
            q: ``(B, H, N, d)`` for positions ``seen .. seen + N - 1``; k, v: ``(B, g, N, d)``.

        Returns:
            ``(B, H, N, d)``: equal to attention over the whole sequence with
            :func:`sliding_window_mask` (for the same ``window`` and ``num_sinks``).
        """
        n = q.shape[2]
        new_pos = torch.arange(self.seen, self.seen + n)  # (N,)
        if self._k is None:
            keys, values, key_pos = k, v, new_pos
        else:
            held = self.positions >= 0  # (W,): slots written so far
            keys = torch.cat([self._k[:, :, held], k], dim=2)  # (B, g, W' + N, d)
            values = torch.cat([self._v[:, :, held], v], dim=2)  # (B, g, W' + N, d)
            key_pos = torch.cat([self.positions[held], new_pos])  # (W' + N,)
        p, j = new_pos[:, None], key_pos[None, :]  # (N, 1), (1, W' + N)
        allowed = (j <= p) & ((j > p - (self.window - self.num_sinks)) | (j < self.num_sinks))  # (N, W' + N)
        mask = torch.zeros(allowed.shape, dtype=q.dtype).masked_fill_(~allowed, float("-inf"))  # (N, W' + N)
        out = grouped_attention(q, keys, values, attn_mask=mask)  # (B, H, N, d)
        self.write(k, v)
        return out
