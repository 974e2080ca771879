"""Sliding-window attention (Longformer, Mistral): each token sees the last W positions.

Convention: a window of W means query position p sees keys ``p - W + 1 .. p``, itself
included: W keys, which is what a cache of W slots can hold. Implementations differ by one:

* Hugging Face's ``transformers`` keeps W keys (``sliding_window_overlay`` in
  ``masking_utils.py``: ``kv_idx > q_idx - sliding_window``), as this module does;
* Mistral's reference code (``one_file_ref.py`` of mistral-inference, the code released with
  Mistral 7B) builds its prefill mask with ``torch.triu(mask, diagonal=-sliding_window)``, which
  keeps W + 1 keys, ``p - W .. p``, while its decode step reads the W slots of its rotating cache;
* Mistral's paper (Jiang et al. 2023) counts the window as positions ``i - W .. i``.

So ``sliding_window_mask(n, W + 1)`` is the reference code's prefill mask for a window of W.

* :func:`sliding_window_mask`: the band mask, bool, ``True`` = may attend.
* :class:`RollingKVCache`: W slots overwritten in turn (the "rolling buffer cache" of
  Jiang et al. 2023), optionally keeping the first ``num_sinks`` tokens for good
  (attention sinks, Xiao et al. 2023, *Efficient Streaming Language Models with Attention
  Sinks*), with rotary positions either as the tokens' places in the text or, as
  StreamingLLM numbers them, as their places in the cache.
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


NUMBERINGS = ("original", "cache")


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

    Positions. Without ``rotate``, q and k arrive already carrying their positions (rotated
    before the call) and the cache stores k as it is. With ``rotate`` (a function
    ``rotate(x, positions)`` such as :func:`mhalib.rope.apply_rope`), q and k arrive unrotated,
    the cache stores the keys **before** rotation, and each step rotates the query and the keys
    it sees by the positions ``numbering`` names:

    * ``"original"``: each token's place in the text. A sink keeps position 0 for good, so the
      offset between the newest query and a sink grows without bound (equal to passing keys
      rotated before caching);
    * ``"cache"``: StreamingLLM's numbering (Xiao et al. 2023, section 3.2): the keys a query sees
      are numbered 0, 1, ... in order, and the query takes the number of its own key, the last;
      no offset ever exceeds ``W - 1``. Without sinks the window is contiguous and RoPE sees the
      same offsets as with ``"original"``; with sinks the gap after them closes.

    Attributes:
        positions: ``(W,)`` long tensor, the position in the text held by each slot (-1 = empty).
    """

    def __init__(self, window, num_sinks=0, *, rotate=None, numbering="original"):
        self.window = _positive_int(window, "window")
        self.num_sinks = _positive_int(num_sinks, "num_sinks", allow_zero=True)
        if self.num_sinks >= self.window:
            raise ValueError(f"num_sinks must be smaller than window; got num_sinks={num_sinks}, window={window}")
        if numbering not in NUMBERINGS:
            raise ValueError(f"numbering must be one of {', '.join(map(repr, NUMBERINGS))}; "
                             f"got numbering={numbering!r}")
        if rotate is None and numbering != "original":
            raise ValueError("numbering='cache' needs rotate (e.g. mhalib.rope.apply_rope): the cache must rotate "
                             "the keys itself, at every step, by their places in the cache")
        if rotate is not None and not callable(rotate):
            raise ValueError(f"rotate must be a function rotate(x, positions), such as mhalib.rope.apply_rope; "
                             f"got {rotate!r}")
        self.rotate, self.numbering = rotate, numbering
        self._k = self._v = None
        self.positions = torch.full((self.window,), -1, dtype=torch.long)
        self.seen = 0  # tokens written so far = the position of the next one

    def __repr__(self):
        rot = "" if self.rotate is None else f", numbering={self.numbering!r}"
        return f"RollingKVCache(window={self.window}, num_sinks={self.num_sinks}{rot}, seen={self.seen})"

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
        """``(B, g, W, d_head)``, slot order (not position order); empty slots hold zeros.

        Unrotated when the cache rotates them itself (``rotate`` given)."""
        return self._k

    @property
    def values(self):
        """``(B, g, W, d_head)``, slot order (not position order); empty slots hold zeros."""
        return self._v

    @property
    def nbytes(self):
        """Bytes of both buffers: fixed at W slots once the first token is written."""
        return 0 if self._k is None else 2 * self._k.numel() * self._k.element_size()

    def attend(self, q, k, v, *, need_weights=False):
        """Attention of the N new queries over their windows, then the new k, v are stored.

        Args:
            q: ``(B, H, N, d)`` for positions ``seen .. seen + N - 1``; k, v: ``(B, g, N, d)``
                (unrotated when the cache has ``rotate``).
            need_weights: also return the attention weights.

        Returns:
            ``(B, H, N, d)``: equal to attention over the whole sequence with
            :func:`sliding_window_mask` (for the same ``window`` and ``num_sinks``) when the
            positions are the tokens' places in the text. With ``need_weights``, ``(out,
            weights, key_positions)``: weights ``(B, H, N, K)`` over the K keys the call saw,
            whose places in the text are ``key_positions`` ``(K,)`` (0 where a query may not look).
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
        if self.rotate is None:
            mask = torch.zeros(allowed.shape, dtype=q.dtype).masked_fill_(~allowed, float("-inf"))  # (N, W' + N)
            res = grouped_attention(q, keys, values, attn_mask=mask, need_weights=need_weights)  # (B, H, N, d)
            out, weights = res if need_weights else (res, None)
        else:
            out, weights = self._attend_rotated(q, keys, values, key_pos, new_pos, allowed)
        self.write(k, v)
        return (out, weights, key_pos) if need_weights else out

    def _attend_rotated(self, q, keys, values, key_pos, new_pos, allowed):
        """One query at a time: its visible keys, rotated by the positions of ``self.numbering``."""
        b, h, n, d = q.shape
        out = q.new_zeros(b, h, n, values.shape[-1])  # (B, H, N, d)
        weights = q.new_zeros(b, h, n, keys.shape[2])  # (B, H, N, K)
        for i in range(n):
            seen = torch.nonzero(allowed[i]).flatten()  # (V,): the keys query i sees
            seen = seen[torch.argsort(key_pos[seen])]  # in text order: sinks, then the window
            if self.numbering == "original":
                k_positions, q_position = key_pos[seen], new_pos[i:i + 1]  # places in the text
            else:
                k_positions = torch.arange(len(seen))  # places in the cache: 0, 1, ..., V - 1
                q_position = k_positions[-1:]  # the query's own key is the last it sees
            k_rot = self.rotate(keys[:, :, seen], k_positions.numpy())  # (B, g, V, d)
            q_rot = self.rotate(q[:, :, i:i + 1], q_position.numpy())  # (B, H, 1, d)
            o, w = grouped_attention(q_rot, k_rot, values[:, :, seen], need_weights=True)  # (B, H, 1, d), (B, H, 1, V)
            out[:, :, i:i + 1] = o
            weights[:, :, i, seen] = w[:, :, 0]
        return out, weights
