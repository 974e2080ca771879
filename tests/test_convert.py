"""K/V conversion: mean pooling against a loop, and exact equivalences on merged models."""

import numpy as np
import pytest
import torch

from mhalib.convert import convert_kv, first_head_kv, mean_pool_kv
from mhalib.copytask import COPY_TASK_CONFIG, evaluate, load_pretrained, make_generator, variable_offset_task
from mhalib.decoder import Decoder
from tolerance import float_tol


@pytest.mark.parametrize("h,g", [(4, 2), (4, 1), (4, 4), (8, 2), (6, 3)])
def test_mean_pool_kv_matches_loop(h, g):
    d_head, d_model = 3, 5
    w = np.random.default_rng(h * 10 + g).normal(size=(h * d_head, d_model))
    heads = [w[i * d_head:(i + 1) * d_head] for i in range(h)]
    expected = np.concatenate([np.mean(heads[k * (h // g):(k + 1) * (h // g)], axis=0) for k in range(g)])
    got = mean_pool_kv(w, h, g)
    assert got.shape == (g * d_head, d_model)
    np.testing.assert_allclose(got, expected)
    torch.testing.assert_close(mean_pool_kv(torch.tensor(w), h, g), torch.tensor(expected))
    first = np.concatenate([heads[k * (h // g)] for k in range(g)])
    np.testing.assert_allclose(first_head_kv(w, h, g), first)


def test_mean_pool_kv_errors():
    w = np.zeros((12, 5))
    with pytest.raises(ValueError, match="num_kv_heads=3"):
        mean_pool_kv(w, 4, 3)
    with pytest.raises(ValueError, match="rows"):
        mean_pool_kv(np.zeros((10, 5)), 4, 2)
    with pytest.raises(ValueError, match="2-D"):
        mean_pool_kv(np.zeros(12), 4, 2)


def model_with_shared_groups(g):
    """An MHA model whose K/V heads are already equal within each group of H/g."""
    torch.manual_seed(0)
    model = Decoder(COPY_TASK_CONFIG)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
        for layer in model.blocks:
            for proj in (layer.attn.k_proj, layer.attn.v_proj):
                heads = proj.weight.view(g, 4 // g, 16, 64)
                heads.copy_(heads[:, :1].expand_as(heads).clone())
    return model.eval()


@pytest.mark.parametrize("g", [1, 2])
@pytest.mark.parametrize("method", ["mean", "first"])
def test_conversion_is_exact_when_groups_already_agree(g, method):
    model = model_with_shared_groups(g).double()  # float64: the claim is exactness, not rounding
    tokens, _ = variable_offset_task().sample(4, make_generator(0))
    converted = convert_kv(model, g, method)
    assert converted.config.num_kv_heads == g
    assert converted.blocks[0].attn.k_proj.weight.shape == (g * 16, 64)
    torch.testing.assert_close(converted(tokens), model(tokens), **float_tol(torch.float64, 2 * 4 * 64))


def test_conversion_copies_the_rest_and_leaves_the_original():
    model, _ = load_pretrained()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    new = convert_kv(model, 2, "random", seed=1)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key])
        if "k_proj" not in key and "v_proj" not in key:
            assert torch.equal(new.state_dict()[key], value)
    again = convert_kv(model, 2, "random", seed=1)
    assert torch.equal(new.blocks[1].attn.v_proj.weight, again.blocks[1].attn.v_proj.weight)
    assert 0.015 < float(new.blocks[1].attn.v_proj.weight.detach().std()) < 0.025


def test_trained_knowledge_survives_mean_better_than_random():
    model, _ = load_pretrained()
    losses = {m: evaluate(convert_kv(model, 2, m), batch_size=256)["loss"] for m in ("mean", "random")}
    assert losses["mean"] < losses["random"]


def test_bad_conversion_arguments():
    model, _ = load_pretrained()
    with pytest.raises(ValueError, match="method"):
        convert_kv(model, 2, "median")
    with pytest.raises(ValueError, match="num_kv_heads=3"):
        convert_kv(model, 3)
    with pytest.raises(ValueError, match="num_kv_heads"):
        convert_kv(convert_kv(model, 1), 2)
