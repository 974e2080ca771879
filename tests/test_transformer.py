"""The toy transformer against torch's own attention, its hooks, and checkpoints.

Oracle: the same model written out in the test from ``nn.MultiheadAttention`` layers
holding copies of its weights (``tests/oracles.py``, which imports nothing from mhalib).
"""

import numpy as np
import pytest
import torch
from torch import nn

from mhalib.attention import GroupedQueryAttention
from mhalib.transformer import (
    ToyConfig, ToyTransformer, load_checkpoint, load_pretrained, save_checkpoint,
)
from oracles import blocked_future, parameter_count, torch_mha_holding


def small_model(seed=0, **kw):
    torch.manual_seed(seed)
    model = ToyTransformer(ToyConfig(**kw))
    with torch.no_grad():  # larger weights than the init so that every test sees sharp patterns
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model.eval()


def tokens(b=3, n=32, seed=1):
    return torch.randint(0, 64, (b, n), generator=torch.Generator().manual_seed(seed))


def test_layers_are_mhalib_gqa():
    model = small_model(num_kv_heads=2)
    assert all(isinstance(layer.attn, GroupedQueryAttention) for layer in model.layers)
    assert model.layers[0].attn.k_proj.weight.shape == (2 * 16, 64)


def test_layer_matches_nn_multiheadattention_with_positions_on_q_and_k():
    model = small_model()
    layer, pos = model.layers[0], model.pos
    a = layer.attn
    x = torch.randn(2, 32, 64)
    ref = torch_mha_holding(a, 4, 4)
    causal = torch.triu(torch.ones(32, 32, dtype=torch.bool), diagonal=1)  # True = blocked
    with torch.no_grad():
        expected, expected_w = ref(x + pos, x + pos, x, attn_mask=causal, average_attn_weights=False)
    got, got_w = layer(x, pos, need_weights=True)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_w, expected_w, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(layer(x, pos), expected, atol=1e-5, rtol=1e-5)  # the fused path


@pytest.mark.parametrize("g", [4, 2, 1])
def test_model_equals_a_stack_of_nn_multihead_attention_layers(g):
    """embed -> (x += MHA(x + pos, x + pos, x), causal) per layer -> unembed, in torch's own modules."""
    model = small_model(num_kv_heads=g)
    t = tokens()  # (B, N)
    n = t.shape[1]
    with torch.no_grad():
        x = model.embed.weight[t]  # (B, N, d_model)
        pos = model.pos[:n]  # (N, d_model): positions, added to what queries and keys read only
        for layer in model.layers:
            ref = torch_mha_holding(layer.attn, 4, g)  # K/V head j copied to query heads j*4/g .. (j+1)*4/g - 1
            x = x + ref(x + pos, x + pos, x, attn_mask=blocked_future(n))[0]  # (B, N, d_model)
        want = x @ model.unembed.weight.T  # (B, N, vocab_size)
        torch.testing.assert_close(model(t), want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(model(t, return_weights=True)[0], want, atol=1e-4, rtol=1e-4)


def test_weights_are_causal_rows_summing_to_one():
    model = small_model()
    with torch.no_grad():
        logits, w = model(tokens(), return_weights=True)
    assert logits.shape == (3, 32, 64) and w.shape == (3, 2, 4, 32, 32)
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 2, 4, 32))
    assert float(w.triu(diagonal=1).abs().max()) == 0.0
    with torch.no_grad():  # the fused path (no weights) agrees with the explicit one
        torch.testing.assert_close(model(tokens()), logits, atol=1e-4, rtol=1e-4)


def test_positions_do_not_reach_the_values():
    """With attention forced uniform (q = 0), the output cannot depend on positions."""
    model = small_model()
    with torch.no_grad():
        for layer in model.layers:
            layer.attn.q_proj.weight.zero_()
    before = model(tokens())
    with torch.no_grad():
        model.pos.normal_(0, 5.0)
    torch.testing.assert_close(model(tokens()), before)


def test_z_hook_identity_and_zero_all_heads():
    model = small_model()
    t = tokens()
    torch.testing.assert_close(model(t, z_hook=lambda i, z: z), model(t))
    direct = model.unembed(model.embed(t))  # (B, N, V): the residual stream without attention
    torch.testing.assert_close(model(t, z_hook=lambda i, z: torch.zeros_like(z)), direct)


def test_default_init_is_small():
    torch.manual_seed(0)
    model = ToyTransformer()
    stds = [float(p.detach().std()) for p in model.parameters()]
    assert all(0.015 < s < 0.025 for s in stds)
    # the same parts in torch's own modules: embedding, positions, two attention layers, unembedding
    positions = nn.Embedding(32, 64)  # (seq_len, d_model)
    layers = [nn.MultiheadAttention(64, 4, bias=False) for _ in range(2)]
    assert parameter_count(model) == parameter_count(nn.Embedding(64, 64), positions, *layers,
                                                     nn.Linear(64, 64, bias=False))
    gqa = ToyTransformer(num_kv_heads=1)  # K and V of one head (16 outputs) in each layer
    kv = [nn.Linear(64, 16, bias=False) for _ in range(4)]
    q_o = [nn.Linear(64, 64, bias=False) for _ in range(4)]
    assert parameter_count(gqa) == parameter_count(nn.Embedding(64, 64), positions, *kv, *q_o,
                                                   nn.Linear(64, 64, bias=False))


def test_checkpoint_round_trip(tmp_path):
    model = small_model(num_layers=1, num_kv_heads=1)
    path = save_checkpoint(model, tmp_path / "m", seed=3, note="x")
    assert path.suffix == ".pt" and (tmp_path / "m.json").exists()
    loaded, meta = load_checkpoint(tmp_path / "m.pt")
    assert meta["seed"] == 3 and meta["config"]["num_layers"] == 1
    assert loaded.config == model.config
    torch.testing.assert_close(loaded(tokens()), model(tokens()), rtol=0, atol=0)


def test_shipped_checkpoint_loads():
    model, meta = load_pretrained()
    assert model.config == ToyConfig()
    assert {"seed", "steps", "batch_size", "lr"} <= set(meta)
    assert not model.training


@pytest.mark.parametrize("bad", [
    lambda m: m(torch.zeros(2, 33, dtype=torch.long)),
    lambda m: m(torch.zeros(2, 8)),
    lambda m: m(torch.zeros(8, dtype=torch.long)),
])
def test_bad_tokens_raise(bad):
    with pytest.raises(ValueError):
        bad(small_model())


def test_bad_config_and_paths_raise(tmp_path):
    with pytest.raises(ValueError, match="num_kv_heads"):
        ToyConfig(num_kv_heads=3)
    with pytest.raises(ValueError, match="d_model"):
        ToyConfig(num_heads=5)
    with pytest.raises(ValueError):
        ToyTransformer(ToyConfig(), num_heads=2)
    with pytest.raises(ValueError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing")
    with pytest.raises(ValueError, match="available"):
        load_pretrained("nope")


def test_copy_loss_matches_explicit_cross_entropy():
    from mhalib.tasks import make_generator, variable_offset_task
    from mhalib.training import copy_loss

    t, mask = variable_offset_task().sample(4, make_generator(0))
    logits = torch.randn(4, 32, 64, generator=torch.Generator().manual_seed(1))
    terms, hits = [], []
    for b in range(4):
        for i in range(1, 32):
            if mask[b, i]:
                terms.append(-torch.log_softmax(logits[b, i - 1], -1)[t[b, i]])
                hits.append(int(logits[b, i - 1].argmax() == t[b, i]))
    loss, acc = copy_loss(logits, t, mask)
    torch.testing.assert_close(loss, torch.stack(terms).mean())
    assert acc == pytest.approx(sum(hits) / len(hits))
    with pytest.raises(ValueError, match="no position"):
        copy_loss(logits, t, torch.zeros_like(mask))


def test_train_history_callback_threads_and_errors():
    from mhalib.training import new_model, steps_to, train

    seen = []
    before = torch.get_num_threads()
    model = new_model(0, num_layers=1)
    hist = train(model, steps=5, progress=False, callback=lambda step, m: seen.append(step))
    assert seen == [1, 2, 3, 4, 5] and len(hist["loss"]) == len(hist["accuracy"]) == 5
    assert torch.get_num_threads() == before
    short = train(model, steps=10, progress=False, callback=lambda step, m: step == 3)
    assert len(short["loss"]) == 3
    assert not model.training
    assert steps_to({"accuracy": [0.0] * 5 + [1.0] * 30}, 0.9, window=10) == 14
    assert steps_to({"loss": [4.0] * 40}, 1.0, key="loss") is None
    with pytest.raises(ValueError, match="steps"):
        train(model, steps=-1)
    with pytest.raises(ValueError, match="task"):
        train(model, task="copy", steps=1)
    with pytest.raises(ValueError, match="num_threads"):
        train(model, steps=1, threads=0)


def test_training_curves_figure():
    import matplotlib
    matplotlib.use("Agg")
    from mhalib.plots import training_curves, uptraining_curves

    hist = {"loss": list(np.linspace(4, 0, 50)), "accuracy": list(np.linspace(0, 1, 50))}
    fig = training_curves({"a": hist, "b": hist}, marks={"x": 10})
    assert [ax.get_xlabel() for ax in fig.axes] == ["training step", "training step"]
    assert len(fig.axes[0].lines) >= 2
    fig2 = uptraining_curves({"m": ([0, 1, 2], [3.0, 1.0, 0.5])}, reference=0.1, marks={"5%": 1})
    assert fig2.axes[0].get_yscale() == "log" and fig2.axes[0].get_xlabel() == "uptraining step"
