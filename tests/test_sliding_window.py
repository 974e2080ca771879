"""Sliding windows against oracles: a loop for the band, SDPA with an explicit mask for the
rolling buffer, boolean reachability for the receptive field."""

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
