"""Short quizzes with checked answers: each wrong choice explains the misconception behind it.

Use in a notebook::

    from mhalib.quiz import quiz
    quiz("02")                 # every question of notebook 02, as buttons
    quiz("02.d_head")          # one question

and in plain Python (or a test)::

    from mhalib.quiz import grade_answer
    grade_answer("02.d_head", "A")      # Feedback(correct=True, message="Correct. ...")

Add questions by appending :class:`Question` objects to :data:`QUESTIONS` (an id
``"NN.name"`` keyed by notebook number). A question has exactly one correct choice; every
choice carries ``why``: the reason it is right, or the misconception that makes it
tempting and why it is wrong.

Only :func:`quiz` imports ipywidgets.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

__all__ = ["Choice", "Question", "Feedback", "QUESTIONS", "questions", "grade_answer", "quiz"]


@dataclass(frozen=True)
class Choice:
    """One answer on offer: its ``text``, whether it is ``correct``, and ``why``."""

    text: str
    correct: bool = False
    why: str = ""


@dataclass(frozen=True)
class Question:
    """A multiple-choice question with exactly one correct :class:`Choice`."""

    id: str
    prompt: str
    choices: tuple

    def __post_init__(self):
        right = [c for c in self.choices if c.correct]
        if len(right) != 1:
            raise ValueError(f"question {self.id!r} needs exactly one correct choice; got {len(right)}")
        if any(not c.why for c in self.choices):
            raise ValueError(f"question {self.id!r}: every choice needs a 'why'")

    @property
    def answer(self) -> int:
        """Index of the correct choice."""
        return next(i for i, c in enumerate(self.choices) if c.correct)


@dataclass(frozen=True)
class Feedback:
    """The verdict on one answer: ``correct`` and a ``message`` in plain words."""

    correct: bool
    message: str


QUESTIONS: dict = {}


def _add(q: Question) -> None:
    QUESTIONS[q.id] = q


# Notebook 01: one head, the scale, the causal mask and the cost of the score matrix.
_add(Question(
    id="01.sqrt_dk",
    prompt="Section 7: the entries of q and k are independent, with mean 0 and variance 1, and "
           "d_k = 64. Why are the scores q.k divided by sqrt(d_k) = 8 before the softmax?",
    choices=(
        Choice("So that each row of attention weights sums to 1.", False,
               "The softmax makes every row sum to 1 at any scale, since it divides by the row's "
               "total. The scale changes how the weight is spread over the keys, not its sum."),
        Choice("The variance of q.k is d_k = 64; dividing by 8 brings it back to 1, so the softmax "
               "does not saturate as heads get wider.", True,
               "Section 7 measures Var(q.k) / d_k close to 1 for d_k from 4 to 1024. Unscaled, at "
               "d_k = 64 the top one of 32 keys already takes 0.815 of a row on average, and the "
               "gradient through the other keys nearly vanishes."),
        Choice("A score is typically about d_k in size, so dividing by sqrt(d_k) only partly "
               "corrects it; dividing by d_k = 64 would be exact.", False,
               "It is the variance that grows like d_k; the typical size of a score is its "
               "standard deviation, sqrt(d_k). Dividing by 64 would leave a variance of "
               "64 / 64^2 = 1/64 and flatten every row towards uniform."),
        Choice("To keep exp from overflowing on large scores.", False,
               "Overflow is prevented by subtracting the row's maximum before exp, which changes "
               "no weight (softmax_row in section 3 does it). The scale matters even where nothing "
               "overflows, because it changes the weights themselves."),
    ),
))

_add(Question(
    id="01.causal_row",
    prompt="Sections 2 to 4: with the additive causal mask (0 on and below the diagonal, -inf "
           "above), what happens to row 2 of A1 in the worked example, the weights of query 2 "
           "over keys 1, 2 and 3?",
    choices=(
        Choice("Key 3 gets weight exactly 0 and keys 1 and 2 still share a total of 1: "
               "[0.33, 0.67, 0].", True,
               "exp(-inf) = 0, and the softmax divides by the total over the allowed keys only, so "
               "the whole weight goes to keys 1 and 2. Query i ends with i non-zero weights, as the "
               "self-check of section 9 counts."),
        Choice("Key 3's weight is set to 0 after the softmax, so the row sums to less than 1.", False,
               "The mask is added to the scores before the softmax, which normalises afterwards. "
               "Zeroing weights after the softmax would leave rows summing to less than 1; every "
               "row sum the notebook prints is 1."),
        Choice("Key 3 keeps a tiny weight that is not quite 0, since -inf stands for a very large "
               "negative number.", False,
               "The mask holds a real -inf, and in floating point exp(-inf) is exactly 0: A1 prints "
               "exact zeros above the diagonal."),
        Choice("Row 2 is cut down to the two keys it may see, so A1 is no longer square.", False,
               "A1 stays T x T = 3 x 3: a blocked key keeps its column, with weight 0. That is why "
               "A1 @ V still works with the whole of V."),
    ),
))

_add(Question(
    id="01.score_memory",
    prompt="Section 8: one head's float32 score matrix takes 4 MiB at n = 1,024 tokens (d_k = 64). "
           "How much does it take at n = 4,096?",
    choices=(
        Choice("16 MiB", False,
               "That grows linearly with n, as Q, K and V (n x d_k) do. The score matrix is n x n: "
               "4 times the tokens give 16 times the entries."),
        Choice("32 MiB", False,
               "That is the float16 answer of the self-check in section 9, at 2 bytes a score. "
               "In float32 every score takes 4 bytes."),
        Choice("64 MiB", True,
               "4,096 x 4,096 scores x 4 bytes = 67,108,864 bytes = 64 MiB, that is "
               "(4,096 / 1,024)^2 = 16 times 4 MiB. Section 8 prints it as 0.062 GiB."),
        Choice("4 GiB", False,
               "That multiplies by d_k = 64, as the FLOP count does. Each score is a sum of d_k "
               "products, but only the sum is stored: one number per (query, key) pair, whatever d_k."),
    ),
))


_add(Question(
    id="02.d_head",
    prompt="d_model = 12 and H = 3. How wide is each head (d_k = d_v)?",
    choices=(
        Choice("12", False, "That would give every head the full width, as if each had its own "
                            "d_model x d_model projection. Standard multi-head attention splits the "
                            "width instead, which keeps the parameter count at 4 d_model^2 whatever H is."),
        Choice("36", False, "That multiplies instead of dividing: three heads of width 12 would "
                            "concatenate to 36 columns, not to d_model = 12."),
        Choice("4", True, "d_k = d_model / H = 12 / 3 = 4: the heads split the width between them, "
                          "so that their concatenation is d_model wide again."),
        Choice("3", False, "3 is the number of heads H, not the width of each one."),
    ),
))

_add(Question(
    id="02.why_heads",
    prompt="Why can H heads of width d_model / H express more than one head of width d_model?",
    choices=(
        Choice("They have more parameters.", False,
               "At a fixed d_model they have exactly as many: d_model^2 per projection and "
               "4 d_model^2 for Q, K, V and O, whatever H is (notebook 02 counts them)."),
        Choice("Each head has its own softmax over its own subspace of features, so for the same "
               "query different heads can attend to different tokens at once.", True,
               "One softmax gives one pattern of who-attends-to-whom per query; H heads give H "
               "patterns (for example one following coreference, another the verb's object), "
               "and W_o combines them."),
        Choice("Each head reads a different part of the sentence.", False,
               "Every head sees every token. What differs is the slice of features each head "
               "projects to, not the positions it reads."),
        Choice("The heads are averaged, which cancels noise.", False,
               "The heads are concatenated, not averaged. Averaging or summing them would mix "
               "their outputs into one d_head-wide space and lose information (notebook 02 "
               "measures the rank)."),
    ),
))

_add(Question(
    id="02.shape_before_wo",
    prompt="x has shape (N, d_model). What is the shape of the matrix that W_o multiplies?",
    choices=(
        Choice("(H, N, d_head)", False,
               "That is the stack of head outputs before merging. W_o is (d_model, d_model), so "
               "the heads are first transposed back to (N, H, d_head) and reshaped to (N, d_model)."),
        Choice("(N, d_head)", False,
               "That is the output of one head. W_o reads all heads at once, concatenated."),
        Choice("(N, N)", False,
               "That is the shape of one head's attention weights, which multiply the values; "
               "W_o multiplies the concatenated head outputs."),
        Choice("(N, d_model)", True,
               "The H head outputs, each (N, d_head), are concatenated side by side: "
               "H * d_head = d_model columns, one row per token."),
    ),
))

_add(Question(
    id="02.params",
    prompt="d_model = 64. How many weights do W_q, W_k, W_v and W_o (no bias) hold with H = 8, "
           "compared with H = 1?",
    choices=(
        Choice("8 times as many with H = 8", False,
               "That would be true if every head kept the full width d_model. The heads share "
               "the width: d_head = 64 / 8 = 8."),
        Choice("The same: 16,384 in both cases", True,
               "Each projection is H blocks of d_model x d_head = d_model x d_model = 4,096 weights; "
               "four projections make 16,384 whatever H is."),
        Choice("8 times fewer with H = 8", False,
               "Each head is 8 times narrower, but there are 8 of them: the total is unchanged."),
    ),
))

_add(Question(
    id="02.wrong_split",
    prompt="Q has shape (B, N, d_model). Which line splits it into heads correctly?",
    choices=(
        Choice("Q.reshape(B, H, N, d_head)", False,
               "It has the right shape but the wrong contents: reshape reads memory in order, so "
               "'head 0' gets the first N * d_head numbers, which are whole rows of the first "
               "tokens. No error is raised; the answer is silently wrong."),
        Choice("Q.transpose(0, 2, 1).reshape(B, H, N, d_head)", False,
               "Transposing first puts features before positions; the reshape then cuts across "
               "tokens and features. The shape fits, the values do not."),
        Choice("Q.reshape(B, N, H, d_head).transpose(0, 2, 1, 3)", True,
               "Reshape keeps each token's row together and cuts it into H pieces; the transpose "
               "then moves the head axis in front of the positions: (B, H, N, d_head)."),
    ),
))


# Notebook 03: the traps of nn.MultiheadAttention and SDPA.
_add(Question(
    id="03.batch_first",
    prompt="x has shape (8, 20, 64): 8 sentences of 20 tokens. What does "
           "nn.MultiheadAttention(64, 8)(x, x, x) do?",
    choices=(
        Choice("It raises a shape error.", False,
               "Both layouts are 3-D with d_model last, so every shape check passes. That is "
               "what makes the misuse silent."),
        Choice("It works correctly: PyTorch detects which axis is the batch.", False,
               "No module can tell a batch axis from a sequence axis by looking at the "
               "numbers; it follows batch_first, which defaults to False."),
        Choice("It runs, reads x as 8 positions of 20 sentences, and mixes the 8 sentences "
               "with each other.", True,
               "batch_first=False is the default, so the first axis is taken as the sequence. "
               "Nothing in the shapes is inconsistent, so nothing complains; the weights come "
               "back as (20, 8, 8) instead of (8, 20, 20)."),
        Choice("It returns an output of shape (20, 8, 64).", False,
               "The output keeps the input's layout, (8, 20, 64): the shape looks right, "
               "only the values are wrong."),
    ),
))

_add(Question(
    id="03.bool_mask",
    prompt="mask = torch.triu(torch.ones(N, N, dtype=torch.bool), diagonal=1). "
           "Which call gives causal attention?",
    choices=(
        Choice("F.scaled_dot_product_attention(q, k, v, attn_mask=mask)", False,
               "SDPA reads True as 'allowed', so this mask lets every query see only the "
               "future, and the last query sees nothing. Pass ~mask, or is_causal=True."),
        Choice("nn.MultiheadAttention(..., attn_mask=mask)", True,
               "In nn.MultiheadAttention True means 'not allowed': the mask blocks everything "
               "above the diagonal, the future."),
        Choice("Both: a boolean mask means the same everywhere in PyTorch.", False,
               "The two functions use opposite conventions; only float masks (0 keep, "
               "-inf block) mean the same in both."),
        Choice("Neither: boolean masks must be converted to float first.", False,
               "Both functions accept boolean masks; the trap is that they read them "
               "in opposite ways."),
    ),
))

_add(Question(
    id="03.mask_3d",
    prompt="B = 4 sentences, H = 8 heads, N = 10. You want a different mask for each "
           "(sentence, head) pair in nn.MultiheadAttention. Which attn_mask shape does it accept?",
    choices=(
        Choice("(4, 10, 10)", False,
               "One mask per sentence is the natural shape, but the module refuses it: a 3-D "
               "mask must be (B * H, N, N). For padding, use key_padding_mask of shape (B, N)."),
        Choice("(4, 8, 10, 10)", False,
               "That is the shape of the scores, and what you would use in your own code, but "
               "nn.MultiheadAttention accepts only 2-D or 3-D masks."),
        Choice("(8, 10, 10)", False,
               "A per-head mask of this shape is neither (N, N) nor (B * H, N, N); the module "
               "refuses it. In hand-written code it would broadcast, but a 3-D mask is "
               "ambiguous there too."),
        Choice("(32, 10, 10), ordered sentence by sentence (b * H + h)", True,
               "A 3-D mask must be (B * H, N, N): the module folds batch and heads into one "
               "axis. Build it with repeat_interleave(H, dim=0) from a per-sentence mask."),
    ),
))

_add(Question(
    id="03.in_proj",
    prompt="What is in_proj_weight of nn.MultiheadAttention(64, 8, bias=False)?",
    choices=(
        Choice("A (64, 192) tensor: [W_Q | W_K | W_V] side by side", False,
               "That is the x @ W layout of NumPy code. PyTorch stores weights as "
               "(d_out, d_in) and computes x @ W.T."),
        Choice("A (192, 64) tensor: the rows of W_Q, then W_K, then W_V", True,
               "nn.Linear weights are (d_out, d_in) and the three projections are stacked by "
               "rows, so a fused output splits as (B, N, 3, H, d_head)."),
        Choice("A (192, 64) tensor ordered head by head: q, k, v of head 0, then of head 1, ...",
               False,
               "Some codebases interleave per head, but nn.MultiheadAttention stacks whole "
               "projections. Splitting it as (B, N, H, 3, d_head) runs and is wrong "
               "(notebook 03, section 5, measures it)."),
    ),
))


# Notebook 04: induction circuits, ablation, redundant heads.
_add(Question(
    id="04.two_layers",
    prompt="Sections 4 and 6: an induction head at a token A attends to the position just after an "
           "earlier A. Why does that take two layers, so that the 1-layer model stays near the "
           "plateau?",
    choices=(
        Choice("One layer has only 4 heads, too few to cover every segment length from 4 to 12.", False,
               "The rule is the same for every length: find the earlier A, take what followed it. "
               "The 2-layer model solves it with the same 4 heads per layer, and its layer-1 "
               "induction heads each do the whole job (section 5)."),
        Choice("The key at the position after the earlier A must say 'my previous token is A'. Only "
               "a previous-token head in an earlier layer can write that into the stream; a layer-0 "
               "key sees just its own token and position.", True,
               "Layer 1 builds its keys from what layer 0 wrote (K-composition). That is why layer 0 "
               "has induction scores near 0 and the 1-layer control cannot leave the plateau."),
        Choice("A previous-token head and an induction head cannot share a layer, because all the "
               "heads of a layer must do the same kind of job.", False,
               "The heads of one layer run side by side and can do different jobs. The limit is "
               "what they read: every head of a layer reads the stream as it was before that layer, "
               "so the induction head must come after the layer whose output it needs."),
        Choice("One layer could learn it too; the 1-layer run was stopped after 1,000 steps, before "
               "its phase change.", False,
               "The 2-layer model fell off its cliff well within 1,000 steps (section 3). More steps "
               "cannot help one layer: its keys are built from one token and one position, so no "
               "setting of the weights lets them know the token before."),
    ),
))

_add(Question(
    id="04.ablation",
    prompt="Section 5: layer 0 head 1 has a previous-token score of 0.82 (section 4). What does "
           "ablating it, zeroing its slice of z, tell you that the score does not?",
    choices=(
        Choice("Whether the model needs the head: without it the loss rises by more than 2, back "
               "towards the plateau.", True,
               "A score says where a head looks; an ablation says whether anything downstream uses "
               "what it writes. Here the whole circuit does: the loss returns to the plateau region."),
        Choice("Nothing new: a head with a high score is by definition one the model relies on.", False,
               "A head can look at the right place and still be ignored, or be backed up by other "
               "heads doing the same job. Only removing it and measuring the loss tells you what the "
               "model loses."),
        Choice("Where the head attends, measured more precisely than by the score.", False,
               "An ablation neither reads nor changes the attention weights: it zeroes the head's "
               "output after attention and measures loss and accuracy. Where a head attends is what "
               "the score measures."),
        Choice("What the head computes: a large rise of the loss identifies it as a previous-token "
               "head.", False,
               "An ablation says how much the model needs a head, not which job it does: removing "
               "any head the circuit depends on would break the model. The role comes from the score."),
    ),
))

_add(Question(
    id="04.redundant",
    prompt="Section 5: ablated one at a time, the induction heads of layer 1 each raise the loss "
           "by less than 0.1; ablated together, by more than 2. What does that show?",
    choices=(
        Choice("The induction heads hardly matter; all three could be pruned.", False,
               "Any one of them can go, but not all of them: together they take the loss back "
               "towards ln 64 = 4.16, a uniform guess over the vocabulary."),
        Choice("Ablation effects add up: the three small rises together make the large one.", False,
               "The single rises, each under 0.1, add up to far less than the rise of more than 2 "
               "when the heads go together. Effects of heads that back each other up do not add."),
        Choice("Removing the layer-1 heads also switches off the previous-token head in layer 0.", False,
               "Layer 0 runs before layer 1, and zeroing layer-1 heads leaves it unchanged: the "
               "previous-token head still writes its output, but the induction heads that read it are gone."),
        Choice("They do the same job redundantly, so each covers for a missing one and single-head "
               "ablation under-states them: ablate sets of heads that share a score.", True,
               "Each of the three can do the induction step alone, so removing one leaves two. Only "
               "removing the whole set shows that the model cannot do without them."),
    ),
))


# Notebook 05: heads in a small language model.
_add(Question(
    id="05.baselines",
    prompt="Section 3: in the first version of this grammar the subject was always the first noun "
           "of its sentence, and trained models passed the agreement probe almost perfectly, far "
           "above a bigram. What did that result show about syntax?",
    choices=(
        Choice("Nothing yet: the rule 'agree with the first noun of the sentence' passed that probe "
               "too. A probe shows something only when every shallow rule that could pass it fails.", True,
               "A high score is evidence of the ability the probe was built for only if cheaper "
               "explanations are ruled out. Here position explained it completely, so the grammar now "
               "puts a noun of random number before the subject, and section 3 checks that the "
               "first-noun rule sits near chance."),
        Choice("That the model found the subject: it beat the bigram, which only sees the previous word.", False,
               "Beating one shallow rule does not rule out the others. The bigram was the only "
               "baseline, and it fails for a reason that has nothing to do with syntax (the word before "
               "the verb is the attractor)."),
        Choice("That agreement across attractors is easy for any transformer.", False,
               "The probe could not tell a transformer that tracks the subject from one that counts "
               "words; it said nothing about how easy the real task is."),
    ),
))

_add(Question(
    id="05.plural",
    prompt="Section 5: removing one layer-1 head leaves singular subjects right and sends plural "
           "subjects to about chance, so overall agreement falls by about a quarter. What is the "
           "right description of that head's role?",
    choices=(
        Choice("Without it the model falls back on the singular: the head is needed to bring plural "
               "number to the verb, not for agreement across attractors in general.", True,
               "Split by the answer, the loss is all on one class; the overall accuracy sits near "
               "what 'right on singulars, a coin flip on plurals' gives. Section 7's patching then "
               "tests whether the number itself travels through that head."),
        Choice("It handles about a quarter of the attractor constructions, and the other heads handle the rest.", False,
               "The damage is not spread over constructions but over one answer class: every "
               "singular item is still right, whatever its construction."),
        Choice("It is a backup head: a quarter of the items needed it because the main head was uncertain.", False,
               "A backup shows up when another head is removed with it; here the split by number "
               "already explains the fall, with nothing removed but this head."),
    ),
))

_add(Question(
    id="05.patching",
    prompt="Section 7: in seed 0, the layer-1 head with the highest verb -> subject attention score "
           "flips few verbs when its output is patched in from the sentence with the subject's number "
           "flipped, while another layer-1 head, with a lower score, flips most of them. What follows?",
    choices=(
        Choice("Where a head looks is not what it writes: the number reaches the verb mostly through the "
               "second head's output, whatever the first head's attention shows.", True,
               "Patching moves exactly one head's output between two inputs that differ only in the "
               "subject's number. The head whose output carries that difference is the one that "
               "changes the verb; a high score is a hypothesis that this test can reject."),
        Choice("Patching is unreliable here, because the flipped sentence is ungrammatical.", False,
               "The flipped sentence is grammatical: its verb forms are not given to the model, and "
               "the subject relative clause's verb is flipped with the subject. The model prefers the "
               "other form on it, as it should."),
        Choice("The first head must be broken: a head that attends to the subject always carries its number.", False,
               "Attention weights choose which value vectors are averaged; what those vectors contain, "
               "and what o_proj writes from them, is separate. A head can read the subject and pass on "
               "something other than its number."),
    ),
))


# Notebook 06: the KV cache, its size, and why decoding is memory-bound.
_add(Question(
    id="06.exact",
    prompt="Decoding with a KV cache instead of recomputing every key and value at each step: "
           "how do the outputs change?",
    choices=(
        Choice("Slightly: the cache is an approximation that trades accuracy for speed.", False,
               "Nothing is approximated. Notebook 06 decodes 32 tokens both ways and the outputs "
               "agree to 1e-12; the cache holds exactly the keys and values recomputing rebuilds."),
        Choice("Not at all: under the causal mask a token's key and value never depend on later "
               "tokens, so the cached ones are exactly what recomputing would give.", True,
               "Caching only skips repeated work. That is why every serving system uses it."),
        Choice("The newest query must now be masked, or it would see future tokens.", False,
               "The cache holds only the past and the newest token itself, all of which the newest "
               "query may see: one query against the cache needs no mask."),
    ),
))

_add(Question(
    id="06.bytes",
    prompt="Llama-3-8B: 32 layers, H = 32 query heads, g = 8 KV heads, d_k = 128, cache in fp16. "
           "How many bytes does its KV cache hold per token?",
    choices=(
        Choice("64 KiB", False, "That counts only the keys (or only the values): the cache keeps "
                                "both, hence the 2 in 2 x layers x g x d_k x bytes."),
        Choice("128 KiB", True, "2 x 32 layers x 8 KV heads x 128 x 2 bytes = 131,072 bytes = 128 KiB, "
                                "a quarter of Llama-2-7B's 512 KiB."),
        Choice("512 KiB", False, "That uses the 32 query heads. Only the g = 8 key/value heads are "
                                 "cached; 512 KiB is Llama-2-7B, which has g = H = 32."),
        Choice("256 KiB", False, "That counts 4 bytes per number (fp32); fp16 is 2 bytes."),
    ),
))

_add(Question(
    id="06.memory_bound",
    prompt="Why is one decoding step limited by memory bandwidth rather than by arithmetic?",
    choices=(
        Choice("The new query does about 1 FLOP per byte of cache it reads (fp16), far below an "
               "accelerator's ridge point of hundreds of FLOP per byte.", True,
               "Each cached key and value is read once and used by a single query; the processor "
               "waits for bytes, so fewer bytes (fewer KV heads) means faster steps."),
        Choice("The FLOPs grow faster with the context length than the bytes do.", False,
               "Both grow linearly with n: 4 n d_k FLOPs against 2 n d_k numbers per head, so the "
               "ratio stays about 1 FLOP per byte at any length."),
        Choice("The softmax over n scores is the expensive part.", False,
               "The softmax touches n numbers per head, while the step reads 2 n d_k numbers of "
               "cache per head: the reads dominate."),
    ),
))


# Notebook 07: MQA and GQA.
_add(Question(
    id="07.repeat",
    prompt="H = 8 query heads, g = 2 K/V heads; k has shape (B, 2, N, d). Which line lets query "
           "head h read K/V head h // 4, as GQA checkpoints expect?",
    choices=(
        Choice("k.repeat_interleave(4, dim=1)", True,
               "Heads come out 0, 0, 0, 0, 1, 1, 1, 1: each K/V head next to itself, so consecutive "
               "query heads share one."),
        Choice("k.repeat(1, 4, 1, 1)", False,
               "repeat tiles: 0, 1, 0, 1, ... Query heads 1, 3, 4 and 6 read the other group's K/V "
               "head. It runs without an error, which is what makes the trap dangerous."),
        Choice("k.expand(B, 8, N, d)", False,
               "expand can only stretch an axis of size 1; the head axis has size 2, so this raises. "
               "Insert a group axis first: k[:, :, None].expand(B, 2, 4, N, d).reshape(B, 8, N, d)."),
        Choice("k.reshape(B, 8, N // 4, d)", False,
               "That folds token positions into the head axis: the heads hold pieces of the sequence, "
               "not copies of a K/V head."),
    ),
))

_add(Question(
    id="07.what_shrinks",
    prompt="From MHA (g = H = 32) to GQA-8 (g = 8): what becomes 4 times smaller?",
    choices=(
        Choice("The number of query projections and of attention maps.", False,
               "The queries stay: 32 query heads, each with its own attention map. GQA shares only "
               "keys and values."),
        Choice("The K and V projections and the KV cache, so the bytes a decoding step reads.", True,
               "g key and g value heads instead of H: W_k, W_v and the cache, 2 g d_k n numbers per "
               "layer, shrink by H / g = 4."),
        Choice("The FLOPs of a decoding step.", False,
               "Every query head still scores all n keys and mixes all n values: 4 H n d_k FLOPs "
               "whatever g is. Only the bytes shrink."),
        Choice("The output projection W_o.", False,
               "W_o still reads the H query heads' outputs, d_model numbers per token."),
    ),
))

_add(Question(
    id="07.cpu_floor",
    prompt="Section 5: copy-free MQA (g = 1, H = 32) reads 32 times fewer K/V bytes than MHA, yet on a "
           "CPU it decodes far less than 32 times faster. Why?",
    choices=(
        Choice("MQA reads its one K/V head once per query head, 32 times.", False,
               "Copy-free grouped attention reads each K/V head once for all the query heads that "
               "share it; copying and re-reading is what repeat_kv then SDPA does for GQA-8."),
        Choice("Two limits. At 16 FLOP per byte (fp32) MQA is past a CPU's ridge point, so the "
               "arithmetic, which g does not reduce, caps the speedup below 32x; and the product of a "
               "few query rows against each block of keys runs below a large matrix product's rate and "
               "does its reads and its arithmetic one after the other, so the speedup stays below even "
               "that cap.",
               True,
               "The roofline cell of section 5 prints both estimates from your machine's measured rates, "
               "next to the measured times: the ridge point explains the ceiling, how the product is "
               "computed explains the gap below it. On a GPU the ridge point is far higher, so MQA stays "
               "memory-bound and keeps gaining."),
        Choice("The ridge point alone: past it, the roofline predicts MQA's time, so the measured "
               "speedup is the roofline's ceiling.", False,
               "The roofline is a lower bound on the time: it lets the reads overlap the arithmetic and "
               "runs the arithmetic at a large matrix product's rate. A decoding step gets neither, so "
               "its measured speedup stays well below the ceiling on a quiet machine."),
        Choice("MQA's cache is too large for the processor's caches.", False,
               "It is 32 times smaller than MHA's; the benchmark flushes the caches for every method "
               "alike."),
    ),
))


# Notebook 08: converting the notebook-04 model from MHA to GQA and MQA.
_add(Question(
    id="08.methods",
    prompt="Sections 2 and 3: the notebook-04 model is converted to GQA-2 by 'mean' (average the "
           "K/V heads of each group), 'first' (keep each group's first head) or 'random' (fresh "
           "K/V weights), then uptrained for 5% of the original steps (75 steps). How do the three "
           "losses compare then?",
    choices=(
        Choice("mean < first < random, as the table of section 3 prints", True,
               "Mean pooling keeps something of every head, 'first' all of one head and nothing of "
               "the other, random nothing at all. The same order holds for MQA, as in Ainslie et al. "
               "(2023, Fig. 4)."),
        Choice("first < mean < random: one intact trained head beats a blur of two unrelated ones.",
               False,
               "Tempting if a group's two heads looked unrelated. But 'first' "
               "drops the previous-token head of layer 0, which sits second in its group: it starts "
               "at 3.86 against mean's 2.74 and is still behind at 5%."),
        Choice("All about equal: uptraining relearns K and V anyway, so the starting point does "
               "not matter.", False,
               "At 5% random is still on a plateau (a loss above 2) while mean has nearly recovered. "
               "The starting point decides how far 75 steps get; only after 20% has every conversion "
               "recovered."),
        Choice("mean < random < first: a fresh start beats a conversion that dropped an essential "
               "head.", False,
               "Random keeps none of the trained keys and values, 'first' keeps one trained head per "
               "group: at 5% random is still on its plateau, far behind first."),
    ),
))

_add(Question(
    id="08.first_order",
    prompt="Section 4: swapping heads 0 and 1 of layer 0 (rows of W_q, W_k, W_v and the matching "
           "columns of W_o) puts the previous-token head first in its GQA-2 group. Converted by "
           "'first', the loss before uptraining is then 2.47 instead of 3.86. Why?",
    choices=(
        Choice("The swap changed what the model computes.", False,
               "The notebook checks that the swapped model gives the same logits: the heads of MHA "
               "can be reordered freely as long as the columns of W_o move with them."),
        Choice("'first' keeps whichever head sits first in each group. As trained, the "
               "previous-token head (head 1) came second and was dropped; after the swap it is the "
               "one kept.", True,
               "So the result of 'first' depends on an accident of head order, not on what the heads "
               "do. Mean pooling does not care about the order within a group."),
        Choice("'first' draws random weights, and the swap changed the draw.", False,
               "'first' draws nothing: it copies trained weights. Only 'random' uses the seed."),
        Choice("The swap moved the previous-token head into the other group, next to a more "
               "similar head.", False,
               "Heads 0 and 1 form group 0 before and after the swap (groups [0, 1] and [2, 3]); "
               "only their order inside the group changed."),
    ),
))

_add(Question(
    id="08.why_uptrain",
    prompt="Section 5: Ainslie et al. find GQA converted from T5-XXL (64 heads, groups of 8) "
           "usable right after conversion, but our GQA-2 by mean starts at loss 2.74 against "
           "0.013 for the MHA model. Which reason does the notebook give?",
    choices=(
        Choice("The toy was not trained long enough for its heads to settle.", False,
               "It reaches accuracy 0.998 and its heads have clear scores (previous-token 0.82, "
               "induction up to 0.98). Undertraining is not the trouble; merging heads that do "
               "different jobs is."),
        Choice("GQA-2 merges too many heads at once; the paper's GQA-8 is a gentler merge.", False,
               "It is the other way round: GQA-8 on 64 heads merges 8 heads into each K/V head, our "
               "GQA-2 only 2. The size of a group is not the problem; what the merged heads do is."),
        Choice("With 4 heads each has its own job: the previous-token head is averaged with a head "
               "that attends differently, and the mean is neither. Among 8 heads of a big model "
               "several are redundant, so merging them costs less.", True,
               "Section 2 merges one pair at a time: pooling the previous-token head with its partner "
               "raises the loss from 0.013 to 0.837, while layer 0's heads 2 and 3 merge for free. The "
               "copy task has a single path to the answer, through one previous-token head."),
        Choice("The K weights of the heads in each group are nearly orthogonal (cosine near 0), so "
               "the heads are unrelated and their mean is neither.", False,
               "A head's W_q and W_k are fixed only up to a change of basis, so K weights of heads "
               "trained from independent starts have cosine near 0 whatever they do: section 2 "
               "changes one head's basis, its attention stays and its K cosine with itself falls "
               "near 0. The QK circuits of the groups have cosines 0.37 to 0.79."),
    ),
))

# Notebook 09: rotary positions with a cache, sliding windows, the online softmax, MLA.
_add(Question(
    id="09.rope_cache",
    prompt="Section 1: a model with rotary positions has 12 tokens cached (positions 0 to 11) and "
           "decodes the next one. What must the step do with the new token's key?",
    choices=(
        Choice("Rotate it by position 12, the cache length, then append it; the cached keys stay "
               "as they are.", True,
               "Each cached key already carries the rotation of its own position, and a score depends "
               "only on the offset between the query's and the key's rotations: section 1 builds the "
               "cache this way and matches one full causal pass."),
        Choice("Rotate it by position 0: each decoding call starts a new sequence of one token.", False,
               "The new token is not the first of anything: rotated at 0, its query and key claim to "
               "sit 12 places before the cached tokens, and section 1's 'positions restarting at 0' "
               "row differs from the full pass."),
        Choice("Append it unrotated, then rotate the whole cache by position 12 before attending.", False,
               "Then every cached key carries the same angle, so the scores lose which key sits where "
               "(only the offset of the angles counts, and it is the same for all of them): section 1's "
               "'rotating after caching' row differs from the full pass."),
    ),
))

_add(Question(
    id="09.window_bytes",
    prompt="Section 2: Mistral-7B (32 layers, 8 K/V heads, head_dim 128, window 4,096) generates "
           "32,768 tokens of one sequence in fp16. How large is its rolling cache at the end?",
    choices=(
        Choice("4 GiB", False,
               "That is a full cache of 32,768 tokens at 128 KiB each. The rolling buffer has 4,096 "
               "slots and overwrites the oldest: tokens that left the window are never read again."),
        Choice("512 MiB", True,
               "128 KiB per token times the 4,096 slots of the window, whatever the length of the "
               "sequence: the cap section 2 prints."),
        Choice("128 KiB", False,
               "That is one token's keys and values over the 32 layers; the buffer holds the last "
               "4,096 of them."),
        Choice("2 GiB", False,
               "That would be 4,096 tokens of a model with 32 K/V heads (multi-head attention, as "
               "Llama-2-7B). Mistral-7B shares each K/V head among 4 query heads: 8 K/V heads."),
    ),
))

_add(Question(
    id="09.merge",
    prompt="Section 3: two chunks of the keys give partial outputs o1 and o2 with log-sum-exps "
           "l1 = 1000 and l2 = 1000 + ln 3. What is the output of attention over all the keys?",
    choices=(
        Choice("0.25 o1 + 0.75 o2", True,
               "Weigh each chunk by its share of the total sum: exp(l_i - max l) gives 1 and 3, so "
               "1/4 and 3/4. Subtracting the largest log-sum-exp first keeps every exp finite."),
        Choice("(o1 + o2) / 2", False,
               "An average treats both chunks as equally heavy, but the second chunk's keys carry "
               "three times the softmax mass of the first's. The log-sum-exps say how much."),
        Choice("exp(l1) o1 + exp(l2) o2, divided by exp(l1) + exp(l2), computed as written", False,
               "Right on paper, but exp(1000) overflows: inf / inf is NaN in floating point. Section 3 "
               "prints what that merge without the max returns. Subtract max(l1, l2) first."),
    ),
))

_add(Question(
    id="09.absorb",
    prompt="Section 4: in multi-head latent attention's absorbed form, what does a decoding step "
           "read from the cache for each earlier token and layer?",
    choices=(
        Choice("Every head's key and value, rebuilt from the latent by kv_b_proj.", False,
               "That is the plain form: it rebuilds H keys and values per token at every step. The "
               "absorbed form folds kv_b_proj's key rows into the query and its value rows into the "
               "output, so no per-head key or value is ever formed."),
        Choice("The latent (kv_lora_rank numbers) and the shared rotary key (qk_rope_head_dim "
               "numbers): 576 numbers for DeepSeek-V3.", True,
               "Scores are the absorbed query against the latent plus the rotary query against the "
               "shared rotary key; the weights then mix latents. Section 4 checks it equals the plain form."),
        Choice("Only the latent: the positions are rotated into it.", False,
               "A rotation between the down- and up-projections would depend on the position, so "
               "kv_b_proj could no longer be folded into the query. That is why MLA keeps a separate "
               "rotary key, shared by all heads."),
    ),
))

_add(Question(
    id="09.crossover",
    prompt="Section 5: one sequence of 1,024 tokens (batch 1). Llama-2-7B (32 K/V heads) against a "
           "copy with 8 K/V heads and the same weights otherwise: what does the decode step save?",
    choices=(
        Choice("A 4x faster step: the cache is 4 times smaller.", False,
               "Only the cache shrinks. Far below the crossover the weights, read once per step, are "
               "most of the bytes, and they do not change."),
        Choice("Little: the weights are most of the bytes read below the crossover, and they stay.", True,
               "1,024 tokens is far below Llama-2-7B's crossover of 25,705 tokens: the cache is a small "
               "part of the step. The saving grows with batch x context and nears 4x only far past it."),
        Choice("Nothing at any batch size: decoding reads the weights, not the cache.", False,
               "Each sequence's cache is read once per step too; past the crossover (batch x context "
               "above 25,705 tokens for Llama-2-7B) it is most of what the step reads."),
    ),
))


def questions(prefix=""):
    """The questions whose id starts with ``prefix`` (e.g. ``"02"``), in the order added."""
    return [q for qid, q in QUESTIONS.items() if qid == prefix or qid.startswith(f"{prefix}.") or not prefix]


def _question(question):
    if isinstance(question, Question):
        return question
    if question in QUESTIONS:
        return QUESTIONS[question]
    raise ValueError(f"unknown question {question!r}; known: {', '.join(QUESTIONS)}")


def _index(q, answer):
    n = len(q.choices)
    letters = "ABCDEFGH"[:n]
    if isinstance(answer, bool):
        answer = None
    if isinstance(answer, int) and 0 <= answer < n:
        return answer
    if isinstance(answer, str):
        a = answer.strip()
        if len(a) == 1 and a.upper() in letters:
            return letters.index(a.upper())
        for i, c in enumerate(q.choices):
            if a == c.text:
                return i
    raise ValueError(
        f"answer {answer!r} is not one of the choices of question {q.id!r}; give an index "
        f"0 to {n - 1}, a letter {', '.join(letters)}, or the exact text of a choice"
    )


def grade_answer(question, answer) -> Feedback:
    """Check one answer.

    Args:
        question: a :class:`Question` or its id (a key of :data:`QUESTIONS`).
        answer: the index of the choice (0-based), its letter ("A", "b", ...), or its text.

    Returns:
        :class:`Feedback`: ``correct`` and a message; a wrong answer's message explains the
        misconception behind that choice.

    Raises:
        ValueError: unknown question, or an answer that names no choice.
    """
    q = _question(question)
    c = q.choices[_index(q, answer)]
    if c.correct:
        return Feedback(True, f"Correct. {c.why}")
    return Feedback(False, f"Not quite. {c.why}")


def _question_widget(q):
    import ipywidgets as w

    letters = "ABCDEFGH"
    listing = "".join(f"<li><b>{letters[i]}</b>. {html.escape(c.text)}</li>" for i, c in enumerate(q.choices))
    prompt = w.HTML(f"<p><b>{html.escape(q.prompt)}</b></p><ul style='list-style: none'>{listing}</ul>")
    feedback = w.HTML()
    feedback.add_class("mhalib-quiz-feedback")
    buttons = [w.Button(description=letters[i], tooltip=c.text, layout=w.Layout(width="48px"))
               for i, c in enumerate(q.choices)]

    def on_click(button):
        i = buttons.index(button)
        try:
            fb = grade_answer(q, i)
            colour = "#1a7f37" if fb.correct else "#9a6700"
            feedback.value = f"<p style='color:{colour}'>{letters[i]}: {html.escape(fb.message)}</p>"
        except Exception as exc:  # noqa: BLE001 - never a traceback in a widget
            feedback.value = f"<p>{html.escape(str(exc))}</p>"
        for b in buttons:
            b.button_style = ""
        button.button_style = "success" if q.choices[i].correct else "warning"

    for b in buttons:
        b.on_click(on_click)
    box = w.VBox([prompt, w.HBox(buttons), feedback])
    box.add_class("mhalib-quiz-question")
    return box


def quiz(*which):
    """Buttons for one or more questions; clicking a choice shows whether it is right and why.

    Args:
        which: question ids, id prefixes (``"02"`` for all of notebook 02) or
            :class:`Question` objects.

    Returns:
        An ipywidgets ``VBox`` (class ``mhalib-quiz``).
    """
    from mhalib.widgets.common import labelled_vbox

    qs = []
    for item in which:
        if isinstance(item, Question) or item in QUESTIONS:
            qs.append(_question(item))
        else:
            found = questions(item)
            if not found:
                raise ValueError(f"no question matches {item!r}; known: {', '.join(QUESTIONS)}")
            qs.extend(found)
    count = f"{len(qs)} question{'s' if len(qs) != 1 else ''}"
    box = labelled_vbox([_question_widget(q) for q in qs], f"[quiz, {count}; run the notebook to answer]")
    box.add_class("mhalib-quiz")
    return box
