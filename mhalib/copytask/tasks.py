"""The copy tasks that the copy-task model learns (notebooks 04 and 08).

Each sequence has ``seq_len`` distinct tokens from a vocabulary of ``vocab_size``,
except for one segment that is repeated straight after itself::

    prefix (random length) | segment (length L) | copy of segment | filler

The model predicts every next token, but only the copy positions after its first
token are predictable, so only those are scored: ``mask[b, i]`` is True when
``tokens[b, i]`` can be read off the earlier occurrence of ``tokens[b, i - 1]``.

* Variable offset (the default, ``min_len=4, max_len=12``): L, and so the distance
  between a token and its copy, changes from sequence to sequence. Position alone
  cannot say where to look; the model has to find the earlier occurrence of the
  current token and read what came after it: an induction head.
* Fixed offset (:func:`fixed_offset_task`, L = 8 always): the answer always sits
  L - 1 positions back, and one layer that attends by position solves it.

Everything is drawn from a ``torch.Generator``, so a seed fixes the data exactly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

__all__ = ["CopyTask", "variable_offset_task", "fixed_offset_task", "distinct_tokens", "make_generator"]


def make_generator(seed):
    """A CPU ``torch.Generator`` seeded with ``seed`` (an int)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int; got {seed!r}")
    return torch.Generator().manual_seed(seed)


@dataclass(frozen=True)
class CopyTask:
    """A copy task: distinct random tokens with one segment repeated.

    Args:
        vocab_size: number of token ids (default 64).
        seq_len: positions per sequence, N (default 32).
        min_len, max_len: the segment length L is drawn uniformly from
            ``min_len .. max_len`` inclusive (default 4 .. 12).

    The prefix length is drawn uniformly from ``0 .. seq_len - 2 L``; the rest after
    the copy is filler. Tokens within a sequence are distinct apart from the copy,
    which needs ``seq_len - min_len <= vocab_size``.
    """

    vocab_size: int = 64
    seq_len: int = 32
    min_len: int = 4
    max_len: int = 12

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "min_len", "max_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int; got {name}={value!r}")
        if not 2 <= self.min_len <= self.max_len:
            raise ValueError(
                f"segment lengths need 2 <= min_len <= max_len; got min_len={self.min_len}, "
                f"max_len={self.max_len}"
            )
        if 2 * self.max_len > self.seq_len:
            raise ValueError(
                f"a segment and its copy must fit: 2 * max_len={2 * self.max_len} > "
                f"seq_len={self.seq_len}; use max_len <= {self.seq_len // 2}"
            )
        if self.seq_len - self.min_len > self.vocab_size:
            raise ValueError(
                f"{self.seq_len - self.min_len} distinct tokens are needed but vocab_size="
                f"{self.vocab_size}; use vocab_size >= {self.seq_len - self.min_len}"
            )

    @property
    def fixed_offset(self):
        """True when every segment has the same length (the copy is always L back)."""
        return self.min_len == self.max_len

    def config(self):
        """The task's fields as a dict (saved next to a checkpoint)."""
        return asdict(self)

    def sample(self, batch_size, generator=None):
        """Draw a batch.

        Args:
            batch_size: B.
            generator: a ``torch.Generator`` (see :func:`make_generator`); ``None`` uses
                torch's global generator.

        Returns:
            ``(tokens, mask)``: ``tokens`` ``(B, N)`` int64, ``mask`` ``(B, N)`` bool,
            True at the positions whose token the copy makes predictable (the copy
            minus its first token: L - 1 positions per sequence).
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int; got {batch_size!r}")
        b, n = batch_size, self.seq_len
        # distinct tokens per row: the first N entries of a random permutation
        perm = torch.rand(b, self.vocab_size, generator=generator).argsort(dim=1)[:, :n]  # (B, N)
        seg_len = torch.randint(self.min_len, self.max_len + 1, (b, 1), generator=generator)  # (B, 1)
        start = (torch.rand(b, 1, generator=generator) * (n - 2 * seg_len + 1)).long()  # (B, 1)
        pos = torch.arange(n)[None, :]  # (1, N)
        copy_start = start + seg_len  # (B, 1): first position of the copy
        in_copy = (pos >= copy_start) & (pos < copy_start + seg_len)  # (B, N)
        source = torch.where(in_copy, pos - seg_len, pos)  # (B, N): copy reads L back
        tokens = perm.gather(1, source)  # (B, N)
        mask = in_copy & (pos > copy_start)  # (B, N): the first copied token is not predictable
        return tokens, mask


def variable_offset_task(vocab_size=64, seq_len=32):
    """The main task: segment length 4 .. 12, so the copy offset varies."""
    return CopyTask(vocab_size=vocab_size, seq_len=seq_len, min_len=4, max_len=12)


def fixed_offset_task(length=8, vocab_size=64, seq_len=32):
    """The control: every segment has length ``length``, so the copy is always ``length`` back."""
    return CopyTask(vocab_size=vocab_size, seq_len=seq_len, min_len=length, max_len=length)


def distinct_tokens(batch_size, generator=None, *, vocab_size=64, seq_len=32):
    """Sequences with no repeated token at all (no copy): ``(B, N)`` int64.

    Useful as a probe: a head that still attends a fixed distance back here does so by
    position, since there is no earlier occurrence of anything to find.
    """
    if seq_len > vocab_size:
        raise ValueError(f"seq_len={seq_len} distinct tokens need vocab_size >= {seq_len}; got {vocab_size}")
    return torch.rand(batch_size, vocab_size, generator=generator).argsort(dim=1)[:, :seq_len]  # (B, N)
