"""The copy tasks: every masked position is predictable by induction, no other is."""

import pytest
import torch

from mhalib.copytask.tasks import (
    CopyTask, distinct_tokens, fixed_offset_task, make_generator, variable_offset_task,
)


def predictable_by_induction(row):
    """Explicit loop: is token i what followed the earlier occurrence of token i - 1?"""
    row = row.tolist()
    out = [False]
    for i in range(1, len(row)):
        earlier = [j for j in range(i - 1) if row[j] == row[i - 1]]
        out.append(any(row[j + 1] == row[i] for j in earlier))
    return out


def test_shapes_and_types():
    tokens, mask = variable_offset_task().sample(8, make_generator(0))
    assert tokens.shape == (8, 32) and tokens.dtype == torch.long
    assert mask.shape == (8, 32) and mask.dtype == torch.bool
    assert int(tokens.min()) >= 0 and int(tokens.max()) < 64


def test_mask_is_exactly_the_induction_predictable_positions():
    tokens, mask = variable_offset_task().sample(200, make_generator(1))
    for row, m in zip(tokens, mask):
        assert m.tolist() == predictable_by_induction(row)


def test_distinct_tokens_except_the_copy():
    tokens, mask = variable_offset_task().sample(300, make_generator(2))
    for row, m in zip(tokens, mask):
        n_masked = int(m.sum())
        seg_len = n_masked + 1
        assert 4 <= seg_len <= 12
        # exactly seg_len tokens appear twice, the others once
        assert len(set(row.tolist())) == 32 - seg_len


def test_lengths_and_starts_cover_their_ranges():
    task = variable_offset_task()
    tokens, mask = task.sample(4000, make_generator(3))
    seg_lens = set((mask.sum(1) + 1).tolist())
    assert seg_lens == set(range(4, 13))
    first_copy = mask.float().argmax(1) - 1  # first scored position - 1 = copy start
    starts = (first_copy - (mask.sum(1) + 1)).tolist()
    assert min(starts) == 0
    assert max(s + 2 * (L + 1) for s, L in zip(starts, mask.sum(1).tolist())) == 32


def test_fixed_offset_copy_is_always_eight_back():
    tokens, mask = fixed_offset_task().sample(500, make_generator(4))
    assert (mask.sum(1) == 7).all()
    b, i = torch.nonzero(mask, as_tuple=True)
    assert torch.equal(tokens[b, i], tokens[b, i - 8])
    assert fixed_offset_task().fixed_offset and not variable_offset_task().fixed_offset


def test_seeded():
    task = variable_offset_task()
    a = task.sample(16, make_generator(5))
    b = task.sample(16, make_generator(5))
    c = task.sample(16, make_generator(6))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


@pytest.mark.parametrize("kwargs", [
    dict(min_len=1), dict(min_len=6, max_len=5), dict(max_len=17), dict(vocab_size=20),
    dict(seq_len=0), dict(vocab_size=2.5),
])
def test_bad_configs_raise(kwargs):
    with pytest.raises(ValueError):
        CopyTask(**kwargs)


def test_bad_batch_size_and_seed_raise():
    with pytest.raises(ValueError, match="batch_size"):
        variable_offset_task().sample(0)
    with pytest.raises(ValueError, match="seed"):
        make_generator("0")


def test_distinct_tokens_never_repeat():
    t = distinct_tokens(50, make_generator(0))
    assert t.shape == (50, 32)
    assert all(len(set(row.tolist())) == 32 for row in t)
    with pytest.raises(ValueError, match="vocab_size"):
        distinct_tokens(2, vocab_size=16)
