"""What an exercise is, for the grader and for ``check()``: graded functions and their cases.

An exercise module (``mhalib/grade/exercises/exNN_*.py``) defines one
:class:`Exercise`: its graded functions (:class:`Graded`), each with

* ``make_cases(rng)``: inputs drawn at grading time with their reference answers,
  computed here, in the grader's process, from ``mhalib``;
* ``judge(case, got)``: ``None`` when ``got`` is right, else a message saying what
  is wrong (shape, dtype, NaN, the common mistake it matches, ...);
* ``forbidden``: callables the learner's function may not use: dotted names, a
  trailing ``.*`` for a whole module. ``mhalib`` is never available to graded code;
  the torch names are replaced by stand-ins that raise (:mod:`mhalib.grade.worker`);
* ``explain_error(case, error, call)`` (optional): when the learner's function
  raises, the mistake behind the exception, or ``None``. ``error`` is the text
  ``"ValueError: ..."``; ``call(args, kwargs)`` calls the learner's function once more,
  on inputs the exercise chooses to tell mistakes apart, and returns its result as
  plain data (``None`` if that call failed too).

A case whose ``raises`` is set is right when the call raises that exception (bad input
the exercise asks to refuse); :func:`judge_raised` and :func:`judge_returned` word the
feedback for both the grader and ``check()``. A case may forbid its own calls
(``forbidden``) and need one (``must_call``: reaching it passes).

The visible tests of ``check()`` are the same cases drawn with a fixed seed. Values are
compared within :data:`RTOL` and :data:`ATOL`, derived from float32. :func:`fix_draws` fixes a
student's draws with the instructor's secret and picks their :class:`Variant`.

This module imports NumPy only; references are imported inside ``make_cases``.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from mhalib.grade.wire import Unsupported

__all__ = [
    "Case", "Graded", "Exercise", "Variant", "Draws", "VISIBLE_SEED", "RTOL", "ATOL",
    "float_tolerance", "student_seed", "variant_of", "fix_draws",
    "describe", "check_array", "check_pair", "check_decode_step", "match_variant", "close",
    "judge_raised", "judge_returned", "explain_error",
    "NUMPY_ATTENTION_FORBIDDEN", "TORCH_ATTENTION_FORBIDDEN", "ATTENTION_FORBIDDEN",
    "FROM_SCRATCH_FORBIDDEN",
]

VISIBLE_SEED = 20240601

# The library's multi-head implementations and torch's built-in attention: a from-scratch
# NumPy exercise may call none of them. (The building blocks of earlier exercises,
# mhalib's softmax, scaled_dot_product_attention, split_heads and merge_heads, stay
# allowed after the exercise that asks for them; each exercise adds its own.)
NUMPY_ATTENTION_FORBIDDEN = (
    "mhalib.np_attention.multi_head_attention",
    "mhalib.np_attention.grouped_query_attention",
    "mhalib.attention.*",
    "mhalib.kv_cache.*",
    "mhalib.decoder.*",
)
TORCH_ATTENTION_FORBIDDEN = (
    "torch._C._nn.scaled_dot_product_attention",
    "torch.nn.functional.multi_head_attention_forward",
    "torch.nn.modules.activation.MultiheadAttention.forward",
)
# Both of the above: what any NumPy attention exercise may not call.
ATTENTION_FORBIDDEN = (*NUMPY_ATTENTION_FORBIDDEN, *TORCH_ATTENTION_FORBIDDEN)
# Exercises 01 and 02 build the blocks themselves: nothing from mhalib.np_attention either.
FROM_SCRATCH_FORBIDDEN = ("mhalib.np_attention.*", *ATTENTION_FORBIDDEN)


# ----------------------------------------------------------------------------- tolerances
def float_tolerance(dtype, terms):
    """``2 gamma_n``: what two computations of the same values in ``dtype`` may differ by.

    A sum of n terms in floating point is within ``gamma_n * sum |x_i|`` of the exact sum,
    ``gamma_n = n u / (1 - n u)``, u = eps / 2 (Higham, *Accuracy and Stability of Numerical
    Algorithms*, 2002, 3.1); two such computations differ by at most twice that. ``terms``: the
    length of the sums behind a value, plus what amplifies an error (``exp(s)`` turns ``|s| u``
    in ``s`` into a relative ``|s| u``: ``|s|`` terms); at least 16.
    """
    u = float(np.finfo(dtype).eps) / 2
    n = max(int(terms), 16)
    return 2 * n * u / (1 - n * u)


# What every judge allows unless it derives its own: an answer computed in float32 or better
# passes (the grader's float32 cases stay float32, and a float64 case may be computed in float32,
# as PyTorch and Hugging Face do). The longest chain of any case: a projection over d_model <= 32,
# scores over d_head <= 16, a softmax and a weighted sum over <= 16 keys (32), and exp's
# amplification of the scores' rounding where they reach 1000 (exercise 01's overflow case):
# 32 + 16 + 32 + 1000 = 1080 terms, so 2 gamma_1080 = 1.29e-4 for float32, relative to the
# values and, for values near zero, to the largest of them (see :func:`close`).
FLOAT32_TERMS = 32 + 16 + 32 + 1000
RTOL = ATOL = float_tolerance(np.float32, FLOAT32_TERMS)


@dataclass
class Case:
    """One call: arguments (plain data), the reference answer and a short label."""

    args: tuple
    kwargs: dict = field(default_factory=dict)
    expected: Any = None
    label: str = ""
    params: dict = field(default_factory=dict)  # for adapters (e.g. d_model of a module)
    extra: dict = field(default_factory=dict)  # anything the judge needs (e.g. inputs)
    raises: str | None = None  # the exception class the call must raise, e.g. "ValueError"
    raises_why: str = ""  # what the exercise asks for, shown when it does not raise it
    # what the exception's message must name: the values given, e.g. -3, (2, 4, 5), or both 6
    # and 4 (numbers as whole numbers, shapes as tuples); see judge_raised
    raises_names: tuple = ()
    forbidden: tuple | None = None  # the calls this case forbids, in place of the graded function's
    must_call: str = ""  # a call the function must make here (its public name): reaching it passes


@dataclass
class Graded:
    """One graded check of an exercise (usually one function)."""

    name: str  # shown in the results; also the learner's function name unless target is set
    points: float
    signature: str
    make_cases: Callable[[np.random.Generator], list]
    judge: Callable[[Case, Any], Any]
    forbidden: tuple = ()
    adapter: str = "function"
    target: str | None = None  # the name looked up in the notebook (default: name)
    arg_names: tuple = ()
    params: dict = field(default_factory=dict)
    description: str = ""
    explain_error: Callable | None = None  # (case, error, call) -> message or None

    def __post_init__(self):
        try:
            self._takes_variant = "variant" in inspect.signature(self.make_cases).parameters
        except (TypeError, ValueError):
            self._takes_variant = False
        if self.arg_names:
            return
        plain_call = re.fullmatch(r"\s*\w+\(([^()]*)\)\s*", self.signature)
        if plain_call:  # the positional parameters without a default, by name
            positional = plain_call.group(1).split("*")[0]
            self.arg_names = tuple(p.strip() for p in positional.split(",") if p.strip() and "=" not in p)
        elif self.adapter == "function":
            raise ValueError(f"graded function {self.name!r}: its signature {self.signature!r} is not a plain "
                             f"call such as 'f(x, n, mask=None)'; give arg_names")

    @property
    def lookup(self):
        """The name looked up in the notebook: ``target`` when set, else ``name``."""
        return self.target or self.name

    def cases(self, rng, variant=None):
        """The cases drawn from ``rng`` for ``variant`` (a :class:`Variant`; ``None`` or the default:
        the course's own exercise)."""
        if self._takes_variant and variant is not None:
            return self.make_cases(rng, variant=variant)
        return self.make_cases(rng)

    def visible_cases(self, variant=None):
        """The cases of ``check()``'s visible tests, drawn with the fixed seed :data:`VISIBLE_SEED`."""
        return self.cases(np.random.default_rng(VISIBLE_SEED), variant)


@dataclass
class Exercise:
    """One exercise: its key, title, graded functions and the modules the child imports first.

    ``forbidden`` is what every graded function of the exercise may not call, unless the
    :class:`Graded` names its own (a Graded with none takes the exercise's: set on it here).
    """
    key: str  # "01_single_head_attention"
    title: str
    graded: list
    preload: tuple = ()  # modules the child imports first ("torch")
    forbidden: tuple = ()
    # the course's own exercise first (code ""), then the variants a student may draw
    variants: tuple = ()

    def __post_init__(self):
        for graded in self.graded:
            graded.forbidden = graded.forbidden or self.forbidden

    @property
    def number(self):
        """The exercise's number as two digits, e.g. ``"01"``."""
        return self.key[:2]

    @property
    def max_score(self):
        """The points of all its graded functions together."""
        return float(sum(g.points for g in self.graded))


# ----------------------------------------------------------------------------- variants and draws
@dataclass
class Variant:
    """One version of an exercise: the course's own (``code`` ``""``) or a per-student variant;
    ``options`` are read by the references, judges and self-checks (``variant["kv_heads"]``)."""
    code: str
    summary: str
    options: dict = field(default_factory=dict)
    short: str = ""  # a few words, for feedback: "K/V head h % g, heads in interleaved columns"

    def __getitem__(self, name):
        return self.options[name]

    @property
    def label(self):
        """``"variant B"``, or ``"the course's own exercise"`` for the default."""
        return f"variant {self.code}" if self.code else "the course's own exercise"


def _student(student_id):
    """A student ID as the variants and seeds read it: its text, spaces around it and case ignored."""
    return str(student_id or "").strip().casefold()


def variant_of(exercise, student_id):
    """The :class:`Variant` of ``exercise`` that ``student_id`` writes (``None``: it has none).
    No ID: the course's own; an ID: another, by SHA-256 of the key and the ID, with no secret,
    so that a learner self-checks their own (``mhalib.check.variant``)."""
    if not exercise.variants:
        return None
    sid, others = _student(student_id), exercise.variants[1:]
    if not sid or not others:
        return exercise.variants[0]
    digest = hashlib.sha256(f"mhalib exercise variant\n{exercise.key}\n{sid}".encode()).digest()
    return others[int.from_bytes(digest[:8], "big") % len(others)]


def student_seed(secret, student_id, exercise_key):
    """The seed of a student's draws: ``HMAC-SHA256(secret, student ID + exercise)``, 63 bits."""
    key = secret if isinstance(secret, bytes) else str(secret).encode()
    mac = hmac.new(key, f"{_student(student_id)}\n{exercise_key}".encode(), hashlib.sha256).digest()
    return int.from_bytes(mac[:8], "big") >> 1


@dataclass
class Draws:
    """How a submission is drawn: the student's ID and its source, the instructor's secret,
    whether to grade variants, whether the seed was given (``--seed``)."""
    student_id: str = ""
    source: str = ""
    secret: bytes | None = field(default=None, repr=False)
    variants: bool = False
    seed_given: bool = False


def _shown(text, limit=60):
    text = "".join(c if c.isprintable() else "?" for c in str(text)[:limit * 2])
    return text if len(text) <= limit else text[:limit - 4] + " ..."


def fix_draws(result, exercise):
    """Seed and variant of a submission of ``exercise``, from ``result.student`` (a :class:`Draws`);
    sets ``result.seed``, ``result.draws`` (what the report says about them) and ``result.variant``
    (the code). Returns the :class:`Variant` to grade (``None`` for an exercise without variants).
    """
    plan = getattr(result, "student", None) or Draws()
    sid = str(plan.student_id or "").strip()
    who = f"student {_shown(sid)}" + (f" ({plan.source})" if plan.source else "")
    if plan.seed_given:
        result.draws = f"drawn from the seed given, {result.seed}"
    elif plan.secret and sid:
        result.seed = student_seed(plan.secret, sid, exercise.key)
        result.draws = (f"fixed for {who} by the instructor's secret: every upload and resubmission is graded "
                        "on the same inputs")
    elif plan.secret:
        result.draws = ("drawn fresh for this run, not fixed: the submission has no student ID to fix them with "
                        "(a resubmission gets new inputs)")
    else:
        result.draws = "drawn fresh for this run, not fixed (no instructor's secret): a resubmission gets new inputs"
    variant = None
    if exercise.variants:
        variant = variant_of(exercise, sid if plan.variants else "")
        if plan.variants and sid:
            result.draws += f"; graded as {variant.label} ({variant.short}), the variant of {who}"
        elif plan.variants:
            result.draws += "; no student ID, so graded as the course's own exercise (no variant)"
    result.variant = variant.code if variant is not None else ""
    return variant


# ----------------------------------------------------------------------------- judging
def describe(got):
    """A short description of what came back, for messages."""
    if isinstance(got, np.ndarray):
        return f"an array of shape {got.shape} and dtype {got.dtype}"
    if isinstance(got, Unsupported):
        why = f" ({got.why})" if got.why else ""
        return f"an object of type {got.type_name}{why}"
    if isinstance(got, tuple):
        return f"a tuple of {len(got)} items"
    if got is None:
        return "None (did you forget `return`?)"
    return f"a {type(got).__name__} ({got!r})"[:200]


def close(got, expected, rtol=RTOL, atol=ATOL):
    """Closeness computed here, in the grader's process, on plain float64 arrays: within
    ``atol`` times the largest expected value (at least 1) plus ``rtol`` times each value."""
    got = np.asarray(got, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape:
        return False
    same_inf = np.array_equal(np.isinf(got), np.isinf(expected)) and np.array_equal(
        got[np.isinf(got)], expected[np.isinf(expected)]
    )
    if not same_inf or np.isnan(got).any():
        return False
    fin = np.isfinite(expected)
    scale = max(1.0, float(np.max(np.abs(expected[fin]), initial=0.0)))
    return bool(np.all(np.abs(got[fin] - expected[fin]) <= atol * scale + rtol * np.abs(expected[fin])))


def check_array(got, expected, what="the result", *, rtol=RTOL, atol=ATOL, float_only=True):
    """Shape, dtype, finiteness and closeness of one array; ``None`` or a message."""
    if not isinstance(got, np.ndarray):
        return f"{what} should be a NumPy array of shape {expected.shape}; got {describe(got)}"
    if got.shape != expected.shape:
        return f"{what} has shape {got.shape}; expected {expected.shape}"
    if float_only:
        if got.dtype.kind == "b":
            return f"{what} has dtype bool; expected a float array"
        if got.dtype.kind == "c":
            return f"{what} is complex ({got.dtype}); expected real floats"
        if got.dtype.kind in "iu":
            return f"{what} has integer dtype {got.dtype}; expected floats (float64 or float32)"
        if got.dtype == np.float16:
            return f"{what} has dtype float16, too imprecise; use float64 or float32"
    g = got.astype(np.float64)
    if np.isnan(g).any():
        return f"{what} contains NaN at {int(np.isnan(g).sum())} of {g.size} entries"
    exp_inf = np.isinf(expected)
    if np.isinf(g).any() and not exp_inf.any():
        return f"{what} contains inf where every value should be finite"
    if not close(g, expected, rtol=rtol, atol=atol):
        if np.array_equal(np.isinf(g), exp_inf):
            fin = np.isfinite(expected)
            err = float(np.max(np.abs(g[fin] - expected[fin]), initial=0.0))
            return f"{what} has the right shape but wrong values (largest difference {err:.3g})"
        return f"{what} has -inf / inf in the wrong places"
    return None


def check_pair(got, names=("out", "weights")):
    """The result must be a tuple of ``len(names)`` items; ``None`` or a message."""
    n = len(names)
    if not isinstance(got, tuple) or len(got) != n:
        return f"return the tuple ({', '.join(names)}); got {describe(got)}"
    return None


def check_decode_step(got, expected, old, explain_cache=None, explain_out=None, time_axis=2):
    """A decode step's ``(out, k_cache, v_cache)`` against ``expected``; ``None`` or a message.

    ``got`` must be that triple; each returned cache must hold one position more than the
    cache it came from (``old``, the two caches passed in; positions along ``time_axis``) and
    equal ``expected[1:]``; then ``out`` must equal ``expected[0]``. ``explain_cache(name, cache)``
    and ``explain_out(out)`` may name a known mistake when a cache or the output differs
    (``None`` keeps the plain message).
    """
    msg = check_pair(got, ("out", "k_cache", "v_cache"))
    if msg:
        return msg
    for name, cache, want, before in zip(("k_cache", "v_cache"), got[1:], expected[1:], old):
        if isinstance(cache, np.ndarray) and cache.shape == np.shape(before):
            return (f"{name} came back with {np.shape(before)[time_axis]} positions: append the new token's "
                    f"{name[0]} (T + 1 positions)")
        msg = check_array(cache, want, f"the returned {name}")
        if msg:
            known = explain_cache(name, cache) if explain_cache and isinstance(cache, np.ndarray) else None
            return known or msg
    msg = check_array(got[0], expected[0], "out")
    if msg and explain_out and isinstance(got[0], np.ndarray):
        return explain_out(got[0]) or msg
    return msg


def match_variant(got, variants, rtol=RTOL, atol=ATOL):
    """The message of the first known mistake whose output ``got`` reproduces, or ``None``.

    ``variants`` is a list of ``(message, make)`` where ``make()`` returns the output of
    the mistaken implementation (computed here), or raises to skip it.
    """
    if not isinstance(got, np.ndarray) or got.dtype.kind not in "fiu":
        return None
    for message, make in variants:
        try:
            wrong = np.asarray(make())
        except Exception:
            continue
        if wrong.shape == got.shape and close(got, wrong, rtol=rtol, atol=atol):
            return message
    return None


# ----------------------------------------------------------------------------- errors
def _names(message, value):
    """Whether ``message`` names ``value``: a whole number, a shape or a word (spaces and case
    ignored); a list of values is named when any of them is."""
    if isinstance(value, list):
        return any(_names(message, v) for v in value)
    text, value = re.sub(r"\s+", "", message), re.sub(r"\s+", "", str(value))
    return re.search(rf"(?<![\d.]){re.escape(value)}(?!\.?\d)", text, flags=re.IGNORECASE) is not None


# What NumPy and PyTorch write when shapes do not fit (an answer without the check fails there,
# later, and may name the sizes by chance), matched as written, never a learner's own words.
_LIBRARY_SHAPE_ERRORS = re.compile("|".join([
    r"cannot reshape (?:array|tensor) of size \d+ into shape",
    r"operands could not be broadcast together with",
    r"could not broadcast input array from shape",
    r"matmul: Input operand \d+ has a mismatch in its core dimension",
    r"all the input array dimensions except for the concatenation axis must match exactly",
    r"shapes \([\d, ]*\) and \([\d, ]*\) not aligned",
    r"negative dimensions are not allowed",
    r"array split does not result in an equal division",
    r"shape '\[[-\d, ]*\]' is invalid for input of size \d+",
    r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)",
    r"mat1 and mat2 shapes cannot be multiplied",
]))


def judge_raised(case, kinds, error):
    """A case that must raise, and raised: ``None`` when it is ``case.raises``, else a message.

    ``kinds``: the class names of the exception and its bases; ``error``: ``"Type: message"``,
    perhaps followed by where. The message must name each of ``raises_names``, in any words
    (``cannot split 6 query heads into 4 equal groups`` names 6 and 4); NumPy's or PyTorch's
    own message for shapes that do not fit does not count, even where it holds the numbers.
    """
    if case.raises not in kinds:
        return f"raised {error}; it should raise {case.raises}: {case.raises_why}"
    message = re.sub(r" at (?:line \d+ of )?(?:code )?cell \d+.*$", "", error).split(":", 1)[-1]
    missing = [" or ".join(map(str, v)) if isinstance(v, list) else str(v)
               for v in case.raises_names if not _names(message, v)]
    named = f", but the message does not name what was given ({', '.join(missing)})" if missing else ""
    if case.raises_names and _LIBRARY_SHAPE_ERRORS.search(message):
        return (f"raised {error}{named}: that is the message NumPy or PyTorch writes for shapes that do not fit, "
                f"from a step after the check the exercise asks for; test the input first and raise {case.raises}: "
                f"{case.raises_why}")
    if missing:
        return f"raised {error}{named}: say what was given, with the values, and raise {case.raises}: {case.raises_why}"
    return None


def judge_returned(case, got):
    """A case that must raise, but returned ``got``: the message."""
    return f"returned {describe(got)}; it should raise {case.raises}: {case.raises_why}"


def explain_error(graded, case, error, call):
    """``graded.explain_error``'s message for an exception, or ``None`` (never raises)."""
    if graded.explain_error is None:
        return None
    try:
        hint = graded.explain_error(case, error, call)
    except Exception:  # noqa: BLE001 - an explanation must never break grading
        return None
    return hint if isinstance(hint, str) and hint else None
