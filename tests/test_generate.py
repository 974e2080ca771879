"""Greedy generation with and without the KV cache (mhalib.generate), on every model of
the course, and convert_kv on the language model: the cache changes how much is computed,
never which tokens come out."""

from __future__ import annotations

import pytest
import torch

from mhalib.convert import convert_kv
from mhalib.generate import generate, new_caches
from mhalib.kv_cache import kv_cache_bytes
from mhalib.language import encode, load_language_model
from mhalib.copytask.model import load_pretrained
from tolerance import float_tol


@pytest.fixture(scope="module")
def lm():
    return load_language_model()


@pytest.fixture(scope="module")
def toy():
    return load_pretrained()[0]


def models(lm, toy):
    yield "language model", lm, torch.tensor([encode("<bos> the dogs near the cat".split())] * 2)
    yield "language model, GQA g = 2", convert_kv(lm, 2), torch.tensor([encode("<bos> when the girl".split())])
    yield "language model, MQA", convert_kv(lm, 1), torch.tensor([encode("<bos> the horses".split())])
    yield "copy-task model", toy, torch.randint(0, toy.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(0))


def test_the_cache_gives_the_same_tokens_and_logits(lm, toy):
    for name, model, prompt in models(lm, toy):
        new = model.config.seq_len - prompt.shape[1] + 1  # as long as the model allows
        cached, recomputed = generate(model, prompt, new), generate(model, prompt, new, use_cache=False)
        assert torch.equal(cached.tokens, recomputed.tokens), name
        assert cached.tokens.shape == (prompt.shape[0], model.config.seq_len + 1), name
        assert torch.allclose(cached.logits, recomputed.logits, atol=1e-4, rtol=0), name
        assert torch.equal(cached.tokens[:, :prompt.shape[1]], prompt), name


def test_the_cache_computes_each_key_and_value_once_and_holds_what_the_formula_says(lm):
    prompt = torch.tensor([encode("<bos> the dogs near the cat".split())])  # 6 tokens
    n, new = prompt.shape[1], 20
    cached, recomputed = generate(lm, prompt, new), generate(lm, prompt, new, use_cache=False)
    assert cached.kv_rows == n + new - 1  # the prompt once, then one row a step
    assert recomputed.kv_rows == sum(n + step for step in range(new))  # the whole sequence every step
    c = lm.config
    assert cached.cache_bytes == kv_cache_bytes(c.num_layers, c.num_kv_heads, c.head_dim, n + new - 1,
                                                bytes_per_element=4)
    gqa = generate(convert_kv(lm, 2), prompt, new)
    assert 2 * gqa.cache_bytes == cached.cache_bytes  # half the K/V heads, half the bytes
    assert recomputed.caches is None and recomputed.cache_bytes == 0


def test_generation_runs_without_dropout_and_gives_the_mode_back(lm):
    from mhalib.decoder import Decoder
    from mhalib.language import language_config

    torch.manual_seed(0)
    model = Decoder(language_config(dropout=0.5)).train()
    prompt = torch.tensor([encode("<bos> the dogs".split())])
    first, second = generate(model, prompt, 10), generate(model, prompt, 10)
    assert model.training and torch.equal(first.logits, second.logits)  # dropout would make them differ


def test_converting_to_as_many_kv_heads_changes_nothing(lm):
    tokens = torch.tensor([encode("<bos> the dogs near the cat do".split())])
    same = convert_kv(lm, lm.config.num_heads)
    with torch.no_grad():
        torch.testing.assert_close(same(tokens), lm(tokens), **float_tol(torch.float32, 2 * (3 * 64 + 4 * 64 + 2 * 64) + 64))
        assert not torch.allclose(convert_kv(lm, 1)(tokens), lm(tokens), atol=1e-3)  # MQA from MHA: a change
    assert [type(m).__name__ for m in same.modules()] == [type(m).__name__ for m in lm.modules()]


def test_bad_requests_are_clear_errors(lm):
    prompt = torch.tensor([encode("<bos> the dogs".split())])
    with pytest.raises(ValueError, match="at most 62 new tokens"):
        generate(lm, prompt, 63)
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int"):
        generate(lm, prompt, 0)
    with pytest.raises(ValueError, match=r"prompt must be an int64 tensor \(B, N\)"):
        generate(lm, [1, 2, 3], 4)
    caches = new_caches(lm)
    with pytest.raises(ValueError, match="kv_caches must be a list of 2 KVCache"):
        lm(prompt, kv_caches=caches[:1])
    with torch.no_grad():
        lm(prompt, kv_caches=caches)
        with pytest.raises(ValueError, match=r"longer than seq_len=64 \(3 cached \+ 62 new\)"):
            lm(torch.zeros(1, 62, dtype=torch.long), kv_caches=caches)


def test_a_sequence_fed_in_pieces_through_the_caches_equals_one_pass(lm, toy):
    """Prefill, then several tokens at once, then one: the logits of one full pass, for both
    models, with a head ablated too."""
    cases = [(lm, torch.tensor([encode("<bos> the dogs near the cat do not like the girl".split())] * 2), {}),
             (lm, torch.tensor([encode("<bos> when the girl sings the dogs run".split())]), {"ablate": [(1, 2)]}),
             (toy, torch.randint(0, toy.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1)), {})]
    for model, tokens, options in cases:
        caches = new_caches(model)
        with torch.no_grad():
            whole = model(tokens, **options)  # (B, N, V)
            n = tokens.shape[1]
            cuts = (0, 3, n - 2, n - 1, n)  # a prompt, several tokens at once, then one and one
            pieces = [model(tokens[:, a:b], kv_caches=caches, **options) for a, b in zip(cuts, cuts[1:])]
        torch.testing.assert_close(torch.cat(pieces, dim=1), whole, **float_tol(torch.float32, 2 * (3 * 64 + 4 * 64 + 2 * 64) + 64),
                                   msg=lambda m, name=type(model).__name__: f"{name}: {m}")
        assert len(caches[0]) == tokens.shape[1]


def test_a_step_that_fails_leaves_the_caches_as_they_were(lm):
    prompt = torch.tensor([encode("<bos> the dogs near".split())])
    caches = new_caches(lm)
    with torch.no_grad():
        lm(prompt, kv_caches=caches)
        with pytest.raises(ValueError, match="replace_weights patches whole attention maps"):
            lm(prompt[:, :1], kv_caches=caches, replace_weights={(0, 0): torch.ones(1, 1, 5) / 5})
        with pytest.raises(RuntimeError):  # a patch of the wrong shape fails in layer 1, after layer 0 appended
            lm(prompt[:, :1], kv_caches=caches, replace_z={(1, 0): torch.ones(3, 3, 3)})
    assert [len(c) for c in caches] == [4, 4]
    with pytest.raises(ValueError, match=r"kv_caches must be a list of 2 KVCache.*\['NoneType', 'NoneType'\]"):
        lm(prompt, kv_caches=[None, None])
