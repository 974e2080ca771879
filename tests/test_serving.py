"""The decode-step bytes: parameter counts from the published shapes, against the published sizes."""

import numpy as np
import pytest

from mhalib.serving import LLAMA_CONFIGS, crossover_tokens, decode_step_bytes, llama_parameter_count


def test_parameter_counts_match_the_published_sizes():
    n2 = llama_parameter_count(**LLAMA_CONFIGS["Llama-2-7B"])
    n3 = llama_parameter_count(**LLAMA_CONFIGS["Llama-3-8B"])
    assert n2 == 6_738_415_616 and round(n2 / 1e9, 1) == 6.7
    assert n3 == 8_030_261_248 and round(n3 / 1e9, 1) == 8.0


def test_crossover_is_where_cache_bytes_equal_weight_bytes():
    for name, c in LLAMA_CONFIGS.items():
        n = llama_parameter_count(**c)
        x = crossover_tokens(n, c["num_layers"], c["num_kv_heads"], c["head_dim"])
        below = decode_step_bytes(n, c["num_layers"], c["num_kv_heads"], c["head_dim"], 1, int(x))
        above = decode_step_bytes(n, c["num_layers"], c["num_kv_heads"], c["head_dim"], 1, int(x) + 1)
        assert below[1] <= below[0] < above[1], name
    assert int(crossover_tokens(llama_parameter_count(**LLAMA_CONFIGS["Llama-2-7B"]), 32, 32, 128)) == 25_705
    assert int(crossover_tokens(llama_parameter_count(**LLAMA_CONFIGS["Llama-3-8B"]), 32, 8, 128)) == 122_532


def test_cache_bytes_grow_with_batch_times_context_and_broadcast():
    w, cache = decode_step_bytes(100, 2, 1, 4, np.array([1, 2, 4]), np.array([10, 10, 10]))
    assert w == 200 and cache.tolist() == [2 * 2 * 4 * 2 * b * 10 for b in (1, 2, 4)]
    with pytest.raises(ValueError, match="batch_size=0"):
        decode_step_bytes(100, 2, 1, 4, 0, 10)
