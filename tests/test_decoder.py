"""The course's one decoder: the copy-task configuration against torch's own attention,
the head contract (ablation, patching, hooks) shared by both families, the seeds of the
shipped runs, and the one checkpoint format.

Oracle: the same model written out in the test from ``nn.MultiheadAttention`` layers
holding copies of its weights (``tests/oracles.py``, which imports nothing from mhalib).
The language configuration has its own written-out oracle in ``tests/test_language.py``.
"""

import numpy as np
import pytest
import torch
from torch import nn

from mhalib.attention import GroupedQueryAttention
from mhalib.checkpoints import load_model, save_model, shipped_models
from mhalib.decoder import Decoder, DecoderConfig
from mhalib.copytask.model import COPY_TASK_CONFIG, copy_task_config, load_pretrained
from oracles import blocked_future, parameter_count, torch_mha_holding
from tolerance import float_tol


def small_model(seed=0, **kw):
    torch.manual_seed(seed)
    model = Decoder(copy_task_config(**kw))
    with torch.no_grad():  # larger weights than the init so that every test sees sharp patterns
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model.eval()


def tokens(b=3, n=32, seed=1):
    return torch.randint(0, 64, (b, n), generator=torch.Generator().manual_seed(seed))


def test_layers_are_mhalib_gqa():
    model = small_model(num_kv_heads=2)
    assert all(isinstance(layer.attn, GroupedQueryAttention) for layer in model.blocks)
    assert model.blocks[0].attn.k_proj.weight.shape == (2 * 16, 64)


def test_layer_matches_nn_multiheadattention_with_positions_on_q_and_k():
    model = small_model()
    layer, pos = model.blocks[0], model.pos.weight
    a = layer.attn
    x = torch.randn(2, 32, 64)
    ref = torch_mha_holding(a, 4, 4)
    causal = torch.triu(torch.ones(32, 32, dtype=torch.bool), diagonal=1)  # True = blocked
    with torch.no_grad():
        expected, expected_w = ref(x + pos, x + pos, x, attn_mask=causal, average_attn_weights=False)
    got, got_w = layer(x, pos, need_weights=True)  # the block adds its output to the stream x
    torch.testing.assert_close(got - x, expected, **float_tol(torch.float32, 2 * 64 + 16 + 2 * 32))
    torch.testing.assert_close(got_w, expected_w, **float_tol(torch.float32, 64 + 16 + 32))
    torch.testing.assert_close(layer(x, pos) - x, expected, **float_tol(torch.float32, 2 * 64 + 16 + 2 * 32))  # the fused path


@pytest.mark.parametrize("g", [4, 2, 1])
def test_model_equals_a_stack_of_nn_multihead_attention_layers(g):
    """embed -> (x += MHA(x + pos, x + pos, x), causal) per layer -> unembed, in torch's own modules."""
    model = small_model(num_kv_heads=g)
    t = tokens()  # (B, N)
    n = t.shape[1]
    with torch.no_grad():
        x = model.embed.weight[t]  # (B, N, d_model)
        pos = model.pos.weight[:n]  # (N, d_model): positions, added to what queries and keys read only
        for layer in model.blocks:
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
        for layer in model.blocks:
            layer.attn.q_proj.weight.zero_()
    before = model(tokens())
    with torch.no_grad():
        model.pos.weight.normal_(0, 5.0)
    torch.testing.assert_close(model(tokens()), before)


def test_z_hook_identity_and_zero_all_heads():
    model = small_model()
    t = tokens()
    torch.testing.assert_close(model(t, z_hook=lambda i, z: z), model(t))
    direct = model.unembed(model.embed(t))  # (B, N, V): the residual stream without attention
    torch.testing.assert_close(model(t, z_hook=lambda i, z: torch.zeros_like(z)), direct)


def test_default_init_is_small():
    torch.manual_seed(0)
    model = Decoder(COPY_TASK_CONFIG)
    stds = [float(p.detach().std()) for p in model.parameters()]
    assert all(0.015 < s < 0.025 for s in stds)
    # the same parts in torch's own modules: embedding, positions, two attention layers, unembedding
    positions = nn.Embedding(32, 64)  # (seq_len, d_model)
    layers = [nn.MultiheadAttention(64, 4, bias=False) for _ in range(2)]
    assert parameter_count(model) == parameter_count(nn.Embedding(64, 64), positions, *layers,
                                                     nn.Linear(64, 64, bias=False))
    gqa = Decoder(copy_task_config(num_kv_heads=1))  # K and V of one head (16 outputs) in each layer
    kv = [nn.Linear(64, 16, bias=False) for _ in range(4)]
    q_o = [nn.Linear(64, 64, bias=False) for _ in range(4)]
    assert parameter_count(gqa) == parameter_count(nn.Embedding(64, 64), positions, *kv, *q_o,
                                                   nn.Linear(64, 64, bias=False))


@pytest.mark.parametrize("config", [copy_task_config(num_layers=1, num_kv_heads=1),
                                    DecoderConfig(vocab_size=20, seq_len=8, d_model=16, num_heads=2, dropout=0.1)])
def test_checkpoint_round_trip(tmp_path, config):
    torch.manual_seed(0)
    model = Decoder(config).eval()
    path = save_model(model, tmp_path / "m", seed=3, note="x")
    assert path.suffix == ".pt" and (tmp_path / "m.json").exists()
    loaded = load_model(tmp_path / "m.pt")
    assert loaded.metadata["seed"] == 3 and loaded.metadata["config"]["num_layers"] == config.num_layers
    assert loaded.config == model.config and not loaded.training
    t = torch.randint(0, config.vocab_size, (2, config.seq_len), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(loaded(t), model(t), rtol=0, atol=0)


def test_every_shipped_model_loads_with_the_one_loader():
    from mhalib.language import language_config

    names = shipped_models()
    assert names == (["induction_2layer"] + [f"induction_2layer_seed{s}" for s in range(1, 10)] + ["language_model"]
                     + [f"language_model_seed{s}" for s in range(1, 10)])
    for name in names:
        model = load_model(name)
        assert isinstance(model, Decoder) and not model.training
        assert model.config == (COPY_TASK_CONFIG if name.startswith("induction_2layer") else language_config())


def test_a_checkpoint_of_another_format_is_refused_with_what_to_do(tmp_path):
    import json

    model = Decoder(copy_task_config(num_layers=1))
    save_model(model, tmp_path / "old")
    meta = json.loads((tmp_path / "old.json").read_text())
    old_config = {k: meta["config"][k] for k in ("vocab_size", "seq_len", "d_model", "num_heads", "num_kv_heads",
                                                 "num_layers")}  # the copy-task model's config before
    (tmp_path / "old.json").write_text(json.dumps({**meta, "config": old_config}))
    with pytest.raises(ValueError, match="does not hold a DecoderConfig.*saved again with save_model"):
        load_model(tmp_path / "old")
    (tmp_path / "old.json").write_text(json.dumps(meta))
    state = torch.load(tmp_path / "old.pt")
    state["pos"] = state.pop("pos.weight")  # the copy-task model's keys before
    torch.save(state, tmp_path / "old.pt")
    with pytest.raises(ValueError, match=r"missing \['pos.weight'\], unexpected \['pos'\]"):
        load_model(tmp_path / "old")


def test_shipped_checkpoint_loads():
    model, meta = load_pretrained()
    assert model.config == COPY_TASK_CONFIG
    assert {"seed", "steps", "batch_size", "lr"} <= set(meta)
    assert not model.training


def _reference_copy_task_init(seed):
    """The copy-task runs' weights, drawn as notebook 04 always drew them: every tensor created
    in the model's order (embedding, four projections per layer, unembedding; positions as
    zeros), then every parameter, positions first, redrawn from N(0, 0.02^2)."""
    torch.manual_seed(seed)
    nn.Embedding(64, 64)
    for _ in range(2):
        for _ in range(4):
            nn.Linear(64, 64, bias=False)
    nn.Linear(64, 64, bias=False)
    names = ["pos.weight", "embed.weight"] + [f"blocks.{i}.attn.{p}_proj.weight" for i in range(2)
                                              for p in "qkvo"] + ["unembed.weight"]
    shapes = {"pos.weight": (32, 64)}
    return {n: torch.empty(shapes.get(n, (64, 64))).normal_(0.0, 0.02) for n in names}


def test_a_seed_gives_the_weights_the_shipped_recipes_drew():
    """One class for both families must not change what a seed draws: retraining from a
    shipped seed must give the shipped run (the language runs' first steps are held in
    tests/test_language.py::test_the_shipped_run_starts_again_as_recorded)."""
    from mhalib.copytask.training import new_model

    want = _reference_copy_task_init(4)
    got = new_model(4).state_dict()
    assert sorted(got) == sorted(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name


def _reference_language_init(seed):
    """The language runs' weights, drawn as the grammar recipe always drew them: every module created
    in the model's order (embedding, positions; per block LayerNorm, four projections, LayerNorm, the
    MLP's two layers with their biases; final LayerNorm, unembedding), then every weight matrix and
    embedding redrawn from N(0, 0.02^2) in that order, biases set to 0, LayerNorms left at 1 and 0."""
    torch.manual_seed(seed)
    made = {"embed": nn.Embedding(114, 64), "pos": nn.Embedding(64, 64)}
    for i in range(2):
        made[f"blocks.{i}.ln_1"] = nn.LayerNorm(64)
        for p in "qkvo":
            made[f"blocks.{i}.attn.{p}_proj"] = nn.Linear(64, 64, bias=False)
        made[f"blocks.{i}.ln_2"] = nn.LayerNorm(64)
        made[f"blocks.{i}.mlp.0"], made[f"blocks.{i}.mlp.2"] = nn.Linear(64, 256), nn.Linear(256, 64)
    made["ln_f"], made["unembed"] = nn.LayerNorm(64), nn.Linear(64, 114, bias=False)
    state = {}
    for name, module in made.items():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(0.0, 0.02)
            if getattr(module, "bias", None) is not None:
                module.bias.data.zero_()
        state.update({f"{name}.{k}": v for k, v in module.state_dict().items()})
    return state


def test_a_seed_gives_the_weights_the_language_recipe_drew():
    from mhalib.language import new_language_model

    want = _reference_language_init(3)
    after_want = torch.rand(4)
    got = new_language_model(3).state_dict()
    after_got = torch.rand(4)
    assert sorted(got) == sorted(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name
    assert torch.equal(after_got, after_want), "the same draws were made (training's batches come after)"


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
        copy_task_config(num_kv_heads=3)
    with pytest.raises(ValueError, match="d_model"):
        copy_task_config(num_heads=5)
    with pytest.raises(ValueError, match="unknown config fields"):
        copy_task_config(heads=2)
    with pytest.raises(ValueError, match="positions must be one of 'residual', 'queries_keys'"):
        DecoderConfig(vocab_size=8, seq_len=8, positions="rotary")
    with pytest.raises(ValueError, match="mlp must be True or False"):
        DecoderConfig(vocab_size=8, seq_len=8, mlp=1)
    with pytest.raises(ValueError, match="dropout"):
        DecoderConfig(vocab_size=8, seq_len=8, dropout=1.0)
    with pytest.raises(ValueError, match="not both"):
        Decoder(COPY_TASK_CONFIG, num_heads=2)
    with pytest.raises(ValueError, match="DecoderConfig"):
        Decoder({"vocab_size": 8})
    with pytest.raises(ValueError, match="no model at .*shipped: induction_2layer"):
        load_model(tmp_path / "missing")
    with pytest.raises(ValueError, match="save_model saves a Decoder"):
        save_model(nn.Linear(2, 2), tmp_path / "x")
    with pytest.raises(ValueError, match="available"):
        load_pretrained("nope")
    model, t = small_model(), tokens()
    with pytest.raises(ValueError, match="replace_z must be a dict"):
        model(t, replace_z=[(0, 0)])
    with pytest.raises(ValueError, match=r"replace_weights holds \(layer, head\) pairs with layer in 0 \.\. 1"):
        model(t, replace_weights={(2, 0): torch.zeros(3, 32, 32)})
    with pytest.raises(ValueError, match=r"qk_input must be a tensor of the shape of x \(3, 32, 64\); got \(3, 31, 64\)"):
        model.blocks[0].attn(torch.zeros(3, 32, 64), qk_input=torch.zeros(3, 31, 64))


def test_next_token_loss_matches_explicit_cross_entropy():
    from mhalib.fit import next_token_loss as copy_loss
    from mhalib.copytask.tasks import make_generator, variable_offset_task

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
    everything, _ = copy_loss(logits, t)  # no mask: every token after the first
    want = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 64), t[:, 1:].reshape(-1))
    torch.testing.assert_close(everything, want, rtol=0, atol=0)


# --- the head contract of GroupedQueryAttention, which every intervention goes through ----


def test_z_hook_sees_the_heads_before_o_proj_and_none_keeps_them():
    torch.manual_seed(0)
    attn = GroupedQueryAttention(16, 4, 2).eval()
    x = torch.randn(2, 5, 16)
    seen = []
    with torch.no_grad():
        base = attn(x, causal=True)
        assert torch.equal(attn(x, causal=True, z_hook=lambda z: seen.append(z)), base)  # None: unchanged
        z = seen[0]  # (B, H, N, d_head)
        assert z.shape == (2, 4, 5, 4)
        torch.testing.assert_close(attn.o_proj(z.transpose(1, 2).reshape(2, 5, 16)), base)
        zeroed = attn(x, causal=True, z_hook=lambda z: z * torch.tensor([1.0, 0, 1, 1])[:, None, None])
        without_head_1 = z.clone()
        without_head_1[:, 1] = 0
        torch.testing.assert_close(zeroed, attn.o_proj(without_head_1.transpose(1, 2).reshape(2, 5, 16)))


def test_pattern_hook_replaces_the_weights_and_reads_this_calls_values():
    torch.manual_seed(0)
    attn = GroupedQueryAttention(16, 4, 2).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        out, weights = attn(x, causal=True, need_weights=True)
        same, same_w = attn(x, causal=True, need_weights=True, pattern_hook=lambda w: None)
        assert torch.equal(same, out) and torch.equal(same_w, weights)
        first = torch.zeros_like(weights)
        first[..., 0] = 1.0  # every query looks at position 0 only
        patched, patched_w = attn(x, causal=True, need_weights=True, pattern_hook=lambda w: first)
        assert torch.equal(patched_w, first)
        v = attn.v_proj(x).view(2, 5, 2, 4).transpose(1, 2)  # (B, g, N, d_head)
        z = v[:, [0, 0, 1, 1], :1].expand(2, 4, 5, 4)  # (B, H, N, d_head): each head's value at position 0
        torch.testing.assert_close(patched, attn.o_proj(z.transpose(1, 2).reshape(2, 5, 16)))


def test_qk_input_moves_the_queries_and_keys_only():
    torch.manual_seed(0)
    attn = GroupedQueryAttention(16, 4, 4).eval()
    x, other = torch.randn(1, 6, 16), torch.randn(1, 6, 16)
    q, k, v = attn.project(x, other)
    q0, k0, v0 = attn.project(other)
    assert torch.equal(q, q0) and torch.equal(k, k0) and torch.equal(v, attn.project(x)[2])


def test_the_user_hook_runs_after_patching_and_ablation_and_record_keeps_what_o_proj_received():
    model, t = small_model(), tokens()
    patch = torch.full((3, 32, 16), 0.5)
    seen, record = {}, {}

    def hook(layer, z):
        seen[layer] = z.clone()
        return z * 2 if layer == 0 else None  # None: keep z

    captured = []
    handle = model.blocks[0].attn.o_proj.register_forward_hook(lambda m, inp, out: captured.append(inp[0]))
    with torch.no_grad():
        model(t, ablate=[(0, 1)], replace_z={(0, 2): patch}, z_hook=hook, record=record)
    handle.remove()
    assert torch.equal(seen[0][:, 1], torch.zeros(3, 32, 16)) and torch.equal(seen[0][:, 2], patch)
    assert torch.equal(record["z"][:, 0], seen[0] * 2) and torch.equal(record["z"][:, 1], seen[1])
    merged = record["z"][:, 0].transpose(1, 2).reshape(3, 32, 64)  # (B, N, d_model): what o_proj read
    assert torch.equal(captured[0], merged)


def test_a_failed_step_leaves_the_copy_task_models_caches_as_they_were():
    from mhalib.generate import new_caches

    # float64: the test is about which rows the caches keep, not about rounding, and in float64
    # the cached and the whole computation agree far below any tolerance on every CPU's kernels
    model, t = small_model().double(), tokens()
    caches = new_caches(model)
    with torch.no_grad():
        model(t[:, :5], kv_caches=caches)

        def broken(layer, z):
            if layer == 1:
                raise RuntimeError("a hook that fails in the last layer")
            return z

        with pytest.raises(RuntimeError, match="fails"):
            model(t[:, 5:9], kv_caches=caches, z_hook=broken)
        assert [len(c) for c in caches] == [5, 5]
        torch.testing.assert_close(model(t[:, 5:9], kv_caches=caches), model(t[:, :9])[:, 5:], **float_tol(torch.float64, 64 * 8))


def test_both_families_take_the_same_interventions():
    from mhalib.language import load_language_model

    for model, vocab in ((load_pretrained()[0], 64), (load_language_model(), 100)):
        t = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(2))
        record = {}
        with torch.no_grad():
            intact = model(t, record=record)
            by_hook = model(t, z_hook=lambda layer, z: z * (torch.arange(z.shape[1]) != 1)[:, None, None]
                            if layer == 1 else z)
            by_name = model(t, ablate=[(1, 1)])
            own = model(t, replace_z={(1, 1): record["z"][:, 1, 1]})  # a head given its own output
            zeros = model(t, replace_z={(1, 1): torch.zeros_like(record["z"][:, 1, 1])})
        assert record["z"].shape == (2, model.num_layers, model.num_heads, 12, model.config.head_dim)
        assert torch.equal(by_hook, by_name) and not torch.allclose(by_name, intact)
        torch.testing.assert_close(own, intact, rtol=0, atol=1e-4)  # the recording run used the eager kernel
        assert torch.equal(zeros, by_name)


def test_train_history_callback_threads_and_errors():
    from mhalib.copytask.training import new_model, steps_to, train

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


def test_measuring_gives_the_mode_and_the_threads_back_also_after_an_error():
    from mhalib.runtime import measuring

    model = small_model().train()
    before = torch.get_num_threads()
    with measuring(model, threads=1):
        assert not model.training and not torch.is_grad_enabled() and torch.get_num_threads() == 1
    assert model.training and torch.is_grad_enabled() and torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="inside"), measuring(model, threads=1):
        raise RuntimeError("inside")
    assert model.training and torch.get_num_threads() == before
