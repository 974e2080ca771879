"""Every exercise spec, end to end, on answers written here independently of mhalib.

The solution notebooks are graded in test_grader.py; these small notebooks make sure
every spec (also those whose notebooks do not exist yet) gives full marks to a correct
answer written in its own way, and zero to the stubs.
"""

from __future__ import annotations

import pytest

from mhalib.grade import exercises as registry
from mhalib.grade.grader import grade_notebook
from mhalib.grade.sandbox import Limits
from test_grader_ex09 import ANSWER as ANSWER_09  # exercise 09's answer and its mutation table live there
from notebook_files import one_cell_notebook

LIMITS = Limits(call_timeout_s=60, cell_timeout_s=120)

ANSWERS = {
    "01_single_head_attention": '''
import numpy as np

def causal_mask(n):
    if not n >= 1:
        raise ValueError(f"n={n}: a mask needs n >= 1 positions")
    i = np.arange(n)
    return np.where(i[None, :] > i[:, None], -np.inf, 0.0)

def scaled_dot_product_attention(q, k, v, mask=None):
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * (1.0 / np.sqrt(q.shape[-1]))
    if mask is not None:
        mask = np.asarray(mask)
        if np.broadcast_shapes(mask.shape, s.shape) != s.shape:
            raise ValueError(f"mask {mask.shape} does not fit the scores {s.shape}")
        s = s + (np.log(mask.astype(float)) if mask.dtype == bool else mask)  # log 1 = 0, log 0 = -inf
    top = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - np.where(top == -np.inf, 0.0, top))
    total = np.sum(e, axis=-1, keepdims=True)
    w = e / np.where(total == 0, 1.0, total)
    return np.matmul(w, v), w
''',
    "02_multi_head_attention": '''
import numpy as np

def split_heads(x, num_heads):
    *lead, n, d = x.shape
    if d % num_heads:
        raise ValueError(f"num_heads={num_heads} must divide d_model={d}")
    return np.moveaxis(x.reshape(*lead, n, num_heads, d // num_heads), -2, -3)

def merge_heads(x):
    *lead, h, n, d = x.shape
    return np.moveaxis(x, -3, -2).reshape(*lead, n, h * d)

def _attend(q, k, v, mask):
    s = np.einsum("...qd,...kd->...qk", q, k) / np.sqrt(q.shape[-1])
    if mask is not None:
        s = s + mask
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return np.einsum("...qk,...kd->...qd", w, v), w

def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads, mask=None):
    q, k, v = (split_heads(x @ w, num_heads) for w in (w_q, w_k, w_v))
    z, w = _attend(q, k, v, mask)
    return merge_heads(z) @ w_o, w
''',
    "03_mha_in_pytorch": '''
import math
import torch
import torch.nn.functional as F
from torch import nn

class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"{num_heads} heads cannot share d_model={d_model} equally")
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            setattr(self, name, nn.Linear(d_model, d_model, bias=False))

    def forward(self, x, causal=False, use_sdpa=False):
        b, n, d = x.shape
        split = lambda t: t.reshape(b, n, self.num_heads, self.head_dim).permute(0, 2, 1, 3)
        q, k, v = split(self.W_Q(x)), split(self.W_K(x)), split(self.W_V(x))
        if use_sdpa:
            z = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        else:
            s = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(self.head_dim)
            if causal:
                s = s + torch.full((n, n), float("-inf")).triu(1)
            z = torch.softmax(s, dim=-1) @ v
        return self.W_O(z.permute(0, 2, 1, 3).reshape(b, n, d))

def to_torch_mha(module):
    d = module.W_Q.weight.shape[1]
    mha = nn.MultiheadAttention(d, module.num_heads, batch_first=True, bias=False)
    mha.load_state_dict({"in_proj_weight": torch.cat([module.W_Q.weight, module.W_K.weight, module.W_V.weight]),
                         "out_proj.weight": module.W_O.weight})
    return mha
''',
    "04_what_heads_learn": '''
import numpy as np

def previous_token_score(weights):
    w = np.asarray(weights, dtype=float)
    w = w.reshape((-1,) + w.shape[-3:])
    n = w.shape[-1]
    return np.mean([w[:, :, i, i - 1] for i in range(1, n)], axis=(0, 1))

def induction_score(weights, tokens):
    w = np.asarray(weights, dtype=float)
    w = w.reshape((-1,) + w.shape[-3:])
    t = np.asarray(tokens).reshape(-1, w.shape[-1])
    t = np.broadcast_to(t, (w.shape[0], w.shape[-1]))
    total, count = np.zeros(w.shape[1]), 0
    for b in range(w.shape[0]):
        for i in range(w.shape[-1]):
            earlier = [j for j in range(i) if t[b, j] == t[b, i]]
            if earlier:
                count += 1
                total += sum(w[b, :, i, j + 1] for j in earlier)
    return total / count if count else total

def ablate_head(z, head):
    keep = np.ones(z.shape[-3], dtype=z.dtype)
    keep[head] = 0
    return z * keep[:, None, None]
''',
    "05_heads_in_language": '''
import math
import numpy as np

def relation_score(weights, pairs):
    w = np.asarray(weights, dtype=float)
    total = np.zeros(w.shape[1])
    for b, target, key in np.asarray(pairs).tolist():
        total += w[b, :, target - 1, key]
    return total / len(pairs)

def probe_accuracy_from_logits(logits, positions, correct, wrong):
    passed = [logits[i, p - 1, c] > logits[i, p - 1, x]
              for i, (p, c, x) in enumerate(zip(positions, correct, wrong))]
    return np.mean(passed)  # a NumPy scalar is a number too

def _loss(logits, tokens):
    terms = []
    for row, seq in zip(np.asarray(logits, dtype=float), tokens):
        for i in range(len(seq) - 1):
            m = row[i].max()
            terms.append(m + math.log(np.exp(row[i] - m).sum()) - row[i, seq[i + 1]])
    return sum(terms) / len(terms)

def ablation_effect(logits, ablated_logits, tokens, positions, correct, wrong):
    acc = [probe_accuracy_from_logits(x, positions, correct, wrong) for x in (logits, ablated_logits)]
    return [acc[0] - acc[1], _loss(ablated_logits, tokens) - _loss(logits, tokens)]
''',
    "06_kv_cache": '''
import numpy as np

def kv_cache_bytes(num_layers, num_kv_heads, head_dim, num_tokens, batch_size=1, bytes_per_element=2):
    return int(np.prod([2, num_layers, num_kv_heads, head_dim, num_tokens, batch_size, bytes_per_element],
                       dtype=object))

def decode_step(x_new, k_cache, v_cache, w_q, w_k, w_v, w_o, num_heads):
    b, _, d = x_new.shape
    dh = d // num_heads
    heads = lambda t: t.reshape(b, 1, num_heads, dh).transpose(0, 2, 1, 3)
    k_cache = np.concatenate([k_cache, heads(x_new @ w_k)], axis=2)
    v_cache = np.concatenate([v_cache, heads(x_new @ w_v)], axis=2)
    q = heads(x_new @ w_q)
    s = q @ k_cache.transpose(0, 1, 3, 2) / np.sqrt(dh)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    z = (p @ v_cache).transpose(0, 2, 1, 3).reshape(b, 1, d)
    return z @ w_o, k_cache, v_cache
''',
    "07_mqa_gqa": '''
import numpy as np

def grouped_query_attention(x, w_q, w_k, w_v, w_o, num_heads, num_kv_heads, mask=None):
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    *lead, n, d = x.shape
    dh = d // num_heads
    q = (x @ w_q).reshape(*lead, n, num_kv_heads, num_heads // num_kv_heads, dh)
    k = (x @ w_k).reshape(*lead, n, num_kv_heads, dh)
    v = (x @ w_v).reshape(*lead, n, num_kv_heads, dh)
    s = np.einsum("...qgrd,...kgd->...grqk", q, k) / np.sqrt(dh)
    s = s.reshape(*lead, num_heads, n, n)
    if mask is not None:
        s = s + mask
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    wg = w.reshape(*lead, num_kv_heads, num_heads // num_kv_heads, n, n)
    z = np.einsum("...grqk,...kgd->...qgrd", wg, v).reshape(*lead, n, d)
    return z @ w_o, w

def multi_query_attention(x, w_q, w_k, w_v, w_o, num_heads, mask=None):
    return grouped_query_attention(x, w_q, w_k, w_v, w_o, num_heads, 1, mask)
''',
    "08_mha_to_gqa": '''
import torch

def mean_pool_kv(weight, num_heads, num_kv_heads):
    rows, d_model = weight.shape
    head_dim = rows // num_heads
    groups = weight.view(num_kv_heads, num_heads // num_kv_heads, head_dim, d_model)
    return groups.mean(dim=1).reshape(num_kv_heads * head_dim, d_model)
''',
    "10_choosing_a_variant": '''
import numpy as np

def cache_bytes(num_layers, num_tokens, num_kv_heads=1, head_dim=1, kv_lora_rank=None, rope_head_dim=0, window=None,
                bytes_per_element=2):
    positions = min(num_tokens, window) if window else num_tokens
    numbers = (kv_lora_rank + rope_head_dim) if kv_lora_rank else 2 * num_kv_heads * head_dim
    return int(np.prod([num_layers, positions, numbers, bytes_per_element], dtype=np.int64))

def recall_accuracy(logits, tokens, mask):
    hits = total = 0
    for row in range(len(tokens)):
        for i in range(1, len(tokens[row])):
            if mask[row][i]:
                total += 1
                hits += int(np.argmax(logits[row][i - 1]) == tokens[row][i])
    return hits / total

def pareto_front(costs, qualities):
    order = sorted(range(len(costs)), key=lambda i: (costs[i], -qualities[i]))
    keep = [False] * len(costs)
    best, best_cost = -np.inf, None
    for i in order:
        if qualities[i] > best or (qualities[i] == best and costs[i] == best_cost):
            keep[i] = True
            if qualities[i] > best:
                best, best_cost = qualities[i], costs[i]
    return np.array(keep)
''',
}

ANSWERS["09_beyond_gqa"] = ANSWER_09


def test_every_spec_has_an_independent_answer_here():
    assert set(ANSWERS) == set(registry.all_exercises())


@pytest.mark.parametrize("key", sorted(ANSWERS))
def test_independent_correct_answer_gets_full_marks(key, tmp_path):
    result = grade_notebook(one_cell_notebook(tmp_path / f"{key}.ipynb", key, ANSWERS[key]), limits=LIMITS)
    assert result.exercise == key
    assert result.score == result.max_score > 0, result.text()


@pytest.mark.parametrize("key", sorted(ANSWERS))
def test_stubs_get_zero(key, tmp_path):
    ex = registry.get(key)
    names = {g.lookup for g in ex.graded}
    stubs = "\n".join(
        f"class {n}:\n    def __init__(self, *a, **k):\n        raise NotImplementedError('{n} is not written yet')\n"
        if n[0].isupper() else
        f"def {n}(*args, **kwargs):\n    raise NotImplementedError('{n} is not written yet')\n"
        for n in sorted(names))
    if key == "03_mha_in_pytorch":
        stubs = "from torch import nn\n" + stubs.replace("class MultiHeadAttention:", "class MultiHeadAttention(nn.Module):")
    result = grade_notebook(one_cell_notebook(tmp_path / f"{key}.ipynb", key, stubs), limits=LIMITS)
    assert result.score == 0, result.text()
    assert all("not written yet" in c.output for c in result.checks), result.text()


def test_a_graded_function_names_its_arguments_from_its_signature_and_takes_the_exercise_forbidden_calls():
    from mhalib.grade.spec import Exercise, Graded

    plain = Graded(name="f", points=1, signature="f(x, w_q, num_heads, mask=None, *, scale, bias=1.0)",
                   make_cases=lambda rng: [], judge=lambda case, got: None)
    method = Graded(name="M", points=1, signature="M(d_model).forward(x)", make_cases=lambda rng: [],
                    judge=lambda case, got: None, adapter="torch_module")
    own = Graded(name="g", points=1, signature="g(n)", make_cases=lambda rng: [], judge=lambda case, got: None,
                 forbidden=("mhalib.kv_cache.*",), arg_names=("count",))
    Exercise(key="99_x", title="x", forbidden=("mhalib.attention.*",), graded=[plain, method, own])
    assert plain.arg_names == ("x", "w_q", "num_heads") and method.arg_names == ()
    assert own.arg_names == ("count",)
    assert plain.forbidden == method.forbidden == ("mhalib.attention.*",) and own.forbidden == ("mhalib.kv_cache.*",)
    with pytest.raises(ValueError, match=r"'h\(x, f\(\)\)' is not a plain call.*give arg_names"):
        Graded(name="h", points=1, signature="h(x, f())", make_cases=lambda rng: [], judge=lambda case, got: None)
