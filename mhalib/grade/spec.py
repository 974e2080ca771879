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
feedback for both the grader and ``check()``.

The visible tests of ``check()`` are the same cases drawn with a fixed seed.

This module imports NumPy only; references are imported inside ``make_cases``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from mhalib.grade.wire import Unsupported

__all__ = [
    "Case", "Graded", "Exercise", "VISIBLE_SEED",
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
    # what the exception's message must name (the values given, e.g. "-3" or "(2, 4, 5)"): an
    # error NumPy raises on its own (reshape, negative dimensions) names none of them
    raises_names: tuple = ()


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

    def visible_cases(self):
        """The cases of ``check()``'s visible tests, drawn with the fixed seed :data:`VISIBLE_SEED`."""
        return self.make_cases(np.random.default_rng(VISIBLE_SEED))


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


def close(got, expected, rtol=1e-4, atol=1e-5):
    """Closeness computed here, in the grader's process, on plain float64 arrays."""
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


def check_array(got, expected, what="the result", *, rtol=1e-4, atol=1e-5, float_only=True):
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


def check_decode_step(got, expected, old, explain_cache=None, explain_out=None):
    """A decode step's ``(out, k_cache, v_cache)`` against ``expected``; ``None`` or a message.

    ``got`` must be that triple; each returned cache must hold one position more than the
    cache it came from (``old``, the two caches passed in) and equal ``expected[1:]``; then
    ``out`` must equal ``expected[0]``. ``explain_cache(name, cache)`` and ``explain_out(out)``
    may name a known mistake when a cache or the output differs (``None`` keeps the plain
    message).
    """
    msg = check_pair(got, ("out", "k_cache", "v_cache"))
    if msg:
        return msg
    for name, cache, want, before in zip(("k_cache", "v_cache"), got[1:], expected[1:], old):
        if isinstance(cache, np.ndarray) and cache.shape == np.shape(before):
            return (f"{name} came back with {np.shape(before)[2]} positions: append the new token's {name[0]} "
                    f"(T + 1 positions)")
        msg = check_array(cache, want, f"the returned {name}")
        if msg:
            known = explain_cache(name, cache) if explain_cache and isinstance(cache, np.ndarray) else None
            return known or msg
    msg = check_array(got[0], expected[0], "out")
    if msg and explain_out and isinstance(got[0], np.ndarray):
        return explain_out(got[0]) or msg
    return msg


def match_variant(got, variants, rtol=1e-4, atol=1e-5):
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
    ignored); a list of values is named when any of them is (``["divisible", "multiple"]``)."""
    if isinstance(value, list):
        return any(_names(message, v) for v in value)
    text, value = re.sub(r"\s+", "", message), re.sub(r"\s+", "", str(value))
    return re.search(rf"(?<![\d.]){re.escape(value)}(?!\.?\d)", text, flags=re.IGNORECASE) is not None


def judge_raised(case, kinds, error):
    """A case that must raise, and raised: ``None`` when it is ``case.raises``, else a message.

    ``kinds`` are the class names of the exception and of its bases (a subclass of
    ValueError counts as a ValueError); ``error`` is its text, ``"Type: message"``, perhaps
    followed by where it was raised (`` at line 3 of cell 2``). When the case lists
    ``raises_names``, the message must name each of them: the exercise asks for an error
    that says what was given, and the one NumPy raises by itself does not.
    """
    if case.raises not in kinds:
        return f"raised {error}; it should raise {case.raises}: {case.raises_why}"
    message = re.sub(r" at line \d+ of cell \d+$", "", error).split(":", 1)[-1]
    missing = [" or ".join(map(str, v)) if isinstance(v, list) else str(v)
               for v in case.raises_names if not _names(message, v)]
    if missing:
        return (f"raised {error}, but the message does not name what was given ({', '.join(missing)}); "
                f"an error NumPy raises by itself is not the check the exercise asks for: test the "
                f"input yourself and raise {case.raises}: {case.raises_why}")
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
