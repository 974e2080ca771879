"""Sliding windows against oracles: a loop for the band, SDPA with an explicit mask for the
rolling buffer, boolean reachability for the receptive field."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mhalib.kv_cache import kv_cache_bytes
from mhalib.sliding_window import RollingKVCache, receptive_field, sliding_window_mask, visible_positions


def band_by_loop(n, window, num_sinks=0):
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            allowed[i, j] = j <= i and (i - j < window - num_sinks or j < num_sinks)
    return allowed


@pytest.mark.parametrize("n, window, sinks", [(9, 3, 0), (9, 1, 0), (6, 10, 0), (12, 5, 2)])
def test_band_mask_equals_the_loop_and_decoding_rows(n, window, sinks):
    assert torch.equal(sliding_window_mask(n, window, num_sinks=sinks), band_by_loop(n, window, sinks))
    assert torch.equal(sliding_window_mask(2, window, n, num_sinks=sinks), band_by_loop(n, window, sinks)[-2:])
    for p in range(n):
        assert torch.nonzero(band_by_loop(n, window, sinks)[p]).flatten().tolist() == visible_positions(p, window, sinks)


@pytest.mark.parametrize("sinks", [0, 2])
def test_rolling_buffer_equals_full_attention_with_the_band_mask(sinks):
    torch.manual_seed(0)
    b, h, g, n, d, window = 2, 4, 2, 17, 8, 5
    q = torch.randn(b, h, n, d, dtype=torch.float64)
    k = torch.randn(b, g, n, d, dtype=torch.float64)
    v = torch.randn(b, g, n, d, dtype=torch.float64)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=band_by_loop(n, window, sinks), enable_gqa=True)
    cache = RollingKVCache(window, num_sinks=sinks)
    outs = [cache.attend(q[:, :, :7], k[:, :, :7], v[:, :, :7])]  # a prompt longer than the window
    outs += [cache.attend(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]) for t in range(7, n)]
    torch.testing.assert_close(torch.cat(outs, dim=2), want, atol=1e-12, rtol=0)
    assert cache.keys.shape == (b, g, window, d) and cache.nbytes == 2 * b * g * window * d * 8
    assert sorted(cache.positions.tolist()) == visible_positions(n - 1, window, sinks)
    # the buffer holds exactly those positions' keys
    for slot, p in enumerate(cache.positions.tolist()):
        torch.testing.assert_close(cache.keys[:, :, slot], k[:, :, p], atol=0, rtol=0)


def test_receptive_field_by_composing_the_masks():
    n, window = 40, 4
    allowed = band_by_loop(n, window).to(torch.int64)
    reach = torch.eye(n, dtype=torch.int64)
    for layers in range(1, 5):
        reach = ((allowed @ reach) > 0).to(torch.int64)  # what the last token can draw on after `layers` layers
        assert int(reach[-1].sum()) == receptive_field(window, layers) == layers * (window - 1) + 1


def test_mistral_cache_with_its_window():
    per_token = kv_cache_bytes(32, 8, 128, 1)
    assert per_token == 128 * 2**10
    assert kv_cache_bytes(32, 8, 128, 4096) == 512 * 2**20


def test_bad_windows_are_refused():
    with pytest.raises(ValueError, match="window=0"):
        sliding_window_mask(3, 0)
    with pytest.raises(ValueError, match="num_sinks=4, window=4"):
        RollingKVCache(4, num_sinks=4)
    with pytest.raises(ValueError, match="n_q=5, n_k=3"):
        sliding_window_mask(5, 2, 3)


def test_the_reference_codes_prefill_mask_keeps_one_key_more_than_hugging_faces():
    n, window = 12, 4
    ones = torch.ones(n, n)
    mistral_reference = torch.triu(torch.tril(ones), diagonal=-window).bool()  # one_file_ref.py's prefill mask
    hf = torch.tensor([[j <= i and j > i - window for j in range(n)] for i in range(n)])  # masking_utils.py
    assert torch.equal(sliding_window_mask(n, window), hf)
    assert torch.equal(sliding_window_mask(n, window + 1), mistral_reference)
    assert mistral_reference.sum(-1).max() == window + 1 and hf.sum(-1).max() == window


def plain_rotated_window(q, k, v, window, sinks, numbering):
    """Attention of each position over visible_positions, RoPE by place in the text or in the cache, float64."""
    from mhalib.rope import apply_rope

    outs, weights = [], []
    for p in range(q.shape[2]):
        seen = visible_positions(p, window, sinks)
        k_pos = seen if numbering == "original" else list(range(len(seen)))
        q_pos = [p] if numbering == "original" else [len(seen) - 1]
        kr = apply_rope(k[:, :, seen], np.array(k_pos)).repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        qr = apply_rope(q[:, :, p:p + 1], np.array(q_pos))
        w = torch.softmax(qr @ kr.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)  # (B, H, 1, V)
        outs.append(w @ v[:, :, seen].repeat_interleave(q.shape[1] // k.shape[1], dim=1))
        weights.append(dict(zip(seen, w[0, 0, 0].tolist())))
    return torch.cat(outs, dim=2), weights


@pytest.mark.parametrize("numbering", ["original", "cache"])
@pytest.mark.parametrize("sinks", [0, 2])
def test_rotating_cache_numbers_positions_in_the_text_or_in_the_cache(numbering, sinks):
    from mhalib.rope import apply_rope

    torch.manual_seed(1)
    b, h, g, n, d, window = 2, 4, 2, 19, 8, 6
    q, k, v = (torch.randn(b, x, n, d, dtype=torch.float64) for x in (h, g, g))
    cache = RollingKVCache(window, num_sinks=sinks, rotate=apply_rope, numbering=numbering)
    outs = [cache.attend(q[:, :, :8], k[:, :, :8], v[:, :, :8])]  # a prompt longer than the window
    outs += [cache.attend(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]) for t in range(8, n)]
    want, _ = plain_rotated_window(q, k, v, window, sinks, numbering)
    torch.testing.assert_close(torch.cat(outs, dim=2), want, atol=1e-12, rtol=0)
    for slot, p in enumerate(cache.positions.tolist()):  # the keys are cached before rotation
        torch.testing.assert_close(cache.keys[:, :, slot], k[:, :, p], atol=0, rtol=0)
    if numbering == "original":  # the same as rotating before caching, and as the band mask
        pre = RollingKVCache(window, num_sinks=sinks)
        qr, kr = apply_rope(q, np.arange(n)), apply_rope(k, np.arange(n))
        stepwise = [pre.attend(qr[:, :, t:t + 1], kr[:, :, t:t + 1], v[:, :, t:t + 1]) for t in range(n)]
        torch.testing.assert_close(torch.cat(stepwise, dim=2), want, atol=1e-12, rtol=0)


def test_the_numberings_agree_without_sinks_and_differ_with_them():
    from mhalib.rope import apply_rope

    torch.manual_seed(2)
    n, window = 40, 8
    q, k, v = (torch.randn(1, 2, n, 16, dtype=torch.float64) for _ in range(3))
    for sinks, differ in ((0, False), (4, True)):
        outs = {}
        for numbering in ("original", "cache"):
            cache = RollingKVCache(window, num_sinks=sinks, rotate=apply_rope, numbering=numbering)
            steps = [cache.attend(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], need_weights=True)
                     for t in range(n)]
            outs[numbering] = torch.cat([o for o, _, _ in steps], dim=2)
            last_w, last_pos = steps[-1][1], steps[-1][2]
            assert torch.allclose(last_w.sum(-1), torch.ones(()).double())
            assert set(last_pos[last_w[0, 0, 0] > 0].tolist()) == set(visible_positions(n - 1, window, sinks))
        gap = (outs["original"] - outs["cache"]).abs().max().item()
        assert (gap > 1e-3) == differ, (sinks, gap)  # only the gap after the sinks changes the offsets
        # before the window fills, the two numberings are the same positions
        assert (outs["original"][:, :, :window] - outs["cache"][:, :, :window]).abs().max() < 1e-12


def test_a_cache_numbering_needs_a_rotation():
    with pytest.raises(ValueError, match="numbering='cache' needs rotate"):
        RollingKVCache(4, numbering="cache")
    with pytest.raises(ValueError, match="numbering='text'"):
        RollingKVCache(4, rotate=lambda x, p: x, numbering="text")
