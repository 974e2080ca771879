"""Self-checks for the exercise notebooks: ``check(name, fn)`` runs the visible tests.

Usage in an exercise notebook::

    from mhalib.check import check
    check("causal_mask", causal_mask)

It calls your function on a few fixed inputs, compares with the course's reference
and prints what is right or, when something is wrong, what exactly (the shape, the
dtype, NaN, or the common mistake your answer matches: "the scores are not divided by
sqrt(d_k)", "heads come out in the wrong order: ..."). It returns ``True`` when
every visible test passes and ``False`` otherwise; it never raises on a wrong answer.

The official grade comes from the grader (``python -m mhalib.grade``), which draws
new inputs at grading time: passing these visible tests is necessary, not sufficient.

``score(name, fn)`` is what the nbgrader version of the course calls in its test cells
(``python -m mhalib.grade.nbgrader``): the grader's cases on fresh inputs, run here in
the kernel, and the points earned, which nbgrader takes as the cell's partial credit.

``variant(exercise, student_id)`` says which version of an exercise a student writes, where
the instructor grades per-student variants (exercises 06, 07 and 09), and makes ``check`` and
``score`` test that version in this kernel: ``variant("07", "s1001")``. Without an ID it is the
course's own exercise.
"""

from __future__ import annotations

import inspect
import sys
import threading

__all__ = ["check", "graded_names", "score", "variant"]

OK, BAD = "\u2714", "\u2718"


_STUDENTS = {}  # exercise key -> the student ID given to variant() in this kernel


def variant(exercise, student_id=None):
    """Which version of ``exercise`` (``"07"``, ``7`` or ``"07_mqa_gqa"``) the student with
    ``student_id`` writes; prints it and returns it (a ``Variant``: ``variant["kv_heads"]``...;
    ``None`` for an exercise without variants). From then on ``check`` and ``score`` test that
    version in this kernel. ``student_id`` ``None`` or ``""``: the course's own exercise.

    The variant is computed from the ID alone (no secret), as the grader computes it when your
    instructor grades variants: use the ID the grader knows you by (your instructor says which).
    """
    from mhalib.grade import exercises as registry
    from mhalib.grade.spec import variant_of

    ex = registry.get(exercise)
    if ex is None:
        known = ", ".join(k[:2] for k in registry.all_exercises())
        print(f"{BAD} variant: there is no exercise {exercise!r}; the exercises are {known}")
        return None
    sid = "" if student_id is None else str(student_id).strip()
    _STUDENTS[ex.key] = sid
    chosen = variant_of(ex, sid)
    if chosen is None:
        print(f"Exercise {ex.number} has no variants: everyone writes the same functions.")
        return None
    who = f"student {sid!r}" if sid else "no student ID"
    print(f"Exercise {ex.number}, {who}: {chosen.label}.\n  {chosen.summary}.")
    if not sid:
        print("  (Where your instructor grades per-student variants, set STUDENT_ID to the ID they give you "
              "and run this cell again.)")
    else:
        print(f"  check(...) in this notebook now runs the visible tests of {chosen.label}; the grader grades it "
              "when your instructor grades variants.")
    return chosen


def _variant_for(ex):
    """The variant ``check`` tests for exercise ``ex`` in this kernel (``None``: the course's own)."""
    from mhalib.grade.spec import variant_of

    return variant_of(ex, _STUDENTS.get(ex.key, "")) if ex.variants else None


def graded_names():
    """Every name ``check`` knows, in exercise order."""
    from mhalib.grade.exercises import all_exercises

    names = []
    for ex in all_exercises().values():
        for g in ex.graded:
            if g.lookup not in names:
                names.append(g.lookup)
    return names


class _Tripwire:
    """Records calls of forbidden callables while the learner's function runs in this kernel
    (the grader's child makes them unusable instead): Python functions by the module whose
    globals they run in, built-ins by module and name; ``tampered`` when the recording was
    switched off."""

    ALLOWED = ("mhalib.grade.", "mhalib.check.", "mhalib.validation.", "mhalib.plots.", "mhalib.widgets.")

    def __init__(self, rules):
        self.exact = {r for r in rules if not r.endswith(".*")}
        self.prefixes = tuple(r[:-1] for r in rules if r.endswith(".*"))
        self.hits, self.tampered, self._previous = [], False, None

    def _hook(self, frame, event, arg):
        try:
            if event == "call":
                code = frame.f_code
                name = f"{frame.f_globals.get('__name__', '')}.{getattr(code, 'co_qualname', code.co_name)}"
            elif event == "c_call":
                name = f"{getattr(arg, '__module__', None) or ''}.{getattr(arg, '__qualname__', '?')}"
            else:
                return
            if not name.startswith(self.ALLOWED) and (name in self.exact or name.startswith(self.prefixes)):
                from mhalib.grade.adapters import FRIENDLY_NAMES

                if FRIENDLY_NAMES.get(name, name) not in self.hits:
                    self.hits.append(FRIENDLY_NAMES.get(name, name))
        except Exception:  # noqa: BLE001 - the hook never breaks the learner's code
            pass

    def __enter__(self):
        self._previous = sys.getprofile()
        if self.exact or self.prefixes:
            threading.setprofile(self._hook)
            sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc):
        if self.exact or self.prefixes:
            self.tampered = sys.getprofile() != self._hook
            sys.setprofile(self._previous)
            threading.setprofile(None)
        return False


def _plain(result):
    """The result as the grader would receive it: plain arrays, numbers and tuples."""
    from mhalib.grade import adapters, wire

    arrays = []
    return wire.decode_value(wire.encode_value(adapters.to_plain(result), arrays), arrays)


def _run_case(graded, fn, case):
    """``("ok", None)`` when the case passes, else ``("fail" or "stop", message)``: the call made
    here, in the kernel, and judged by the grader's own step (:func:`mhalib.grade.grader.judge_outcome`)."""
    from mhalib.grade import adapters, grader
    from mhalib.grade.sandbox import CallOutcome

    ns = dict(getattr(fn, "__globals__", {}) or {})
    if isinstance(fn, type):
        module = sys.modules.get(getattr(fn, "__module__", ""), None)
        ns.update(vars(module) if module is not None else {})
    ns[graded.lookup] = fn
    params = {**graded.params, **case.params, "signature": graded.signature,
              "arg_names": list(graded.arg_names)}

    def run(args, kwargs, tripwire):
        try:
            result, after = adapters.call(graded.adapter, ns, graded.lookup, args, kwargs, params, tripwire)
        except NotImplementedError:
            return CallOutcome("not_implemented")
        except adapters.GradingError as exc:
            return CallOutcome("grading_error", message=str(exc))
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - report, never raise
            text = str(exc)
            return CallOutcome("exception", message=f"{type(exc).__name__}" + (f": {text[:400]}" if text else ""),
                               kinds=[c.__name__ for c in type(exc).__mro__][:12])
        return CallOutcome("ok", result=_plain(result), after=after)

    def call_again(args, kwargs):  # the learner's function once more, for explain_error
        outcome = run(args, kwargs, _Tripwire(graded.forbidden))
        return outcome.result if outcome.status == "ok" else None

    tripwire = _Tripwire(graded.forbidden if case.forbidden is None else case.forbidden)
    outcome = run(case.args, case.kwargs, tripwire)
    if tripwire.hits:
        outcome = CallOutcome("forbidden", hits=list(tripwire.hits))
    elif tripwire.tampered:
        return "stop", f"{graded.lookup} switched off the recording of its calls (sys.setprofile)"
    verdict, message = grader.judge_outcome(graded, case, outcome, call_again)
    return ("ok", None) if verdict == "pass" else ("fail" if verdict == "fail" else "stop", message)


def _outcomes(graded, fn, cases):
    """``(status, message)`` of each case, in order, stopping at the first "stop"."""
    for case in cases:
        try:
            status, message = _run_case(graded, fn, case)
        except Exception as exc:  # noqa: BLE001 - a check must never crash the notebook
            status, message = "fail", f"could not be checked ({type(exc).__name__}: {exc})"
        yield case, status, message
        if status == "stop":
            return


def _check_one(graded, fn, variant=None):
    try:
        cases = graded.visible_cases(variant)
    except Exception as exc:  # noqa: BLE001
        return False, f"the visible tests for {graded.name} could not be prepared ({type(exc).__name__}: {exc})"
    which = f" of {variant.label}" if variant is not None and variant.code else ""
    for i, (case, status, message) in enumerate(_outcomes(graded, fn, cases), 1):
        if status != "ok":
            label = f" ({case.label})" if case.label else ""
            return False, message if status == "stop" else f"visible test {i} of {len(cases)}{which}{label}: {message}"
    return True, f"all {len(cases)} visible tests{which} pass (the grader will use new inputs)"


def check(name, fn=None):
    """Run the visible tests of graded function ``name`` on ``fn``; print feedback.

    Args:
        name: the graded name, e.g. ``"causal_mask"`` or ``"MultiHeadAttention"``.
        fn: your function (or class); by default the object called ``name`` in the
            notebook.

    Returns:
        ``True`` if every visible test passes, else ``False``. Never raises on a
        wrong answer.
    """
    try:
        from mhalib.grade.exercises import find_graded

        entries = find_graded(name)
    except Exception as exc:  # noqa: BLE001
        print(f"{BAD} check({name!r}): the tests could not be loaded ({type(exc).__name__}: {exc})")
        return False
    if not entries:
        known = ", ".join(graded_names())
        print(f"{BAD} check: there is no graded function called {name!r}; known names: {known}")
        return False
    if fn is None:
        frame = inspect.currentframe()
        caller = frame.f_back.f_globals if frame and frame.f_back else {}
        fn = caller.get(name)
        if fn is None:
            print(f"{BAD} {name}: not defined yet; run the cell that defines it first")
            return False
    all_ok = True
    for ex, graded in entries:
        ok, message = _check_one(graded, fn, _variant_for(ex))
        all_ok &= ok
        print(f"{OK if ok else BAD} {graded.name}: {message}")
    return all_ok


def score(name, fn=None, *, seed=None):
    """Points earned by ``fn`` on graded check ``name`` (e.g. ``"causal_mask (n < 1)"``): the
    grader's cases on inputs drawn now (``seed`` fixes them), with its partial credit. Prints
    what is wrong and never raises on a wrong answer. It runs in this kernel: the
    forbidden-call rule is recorded here, not enforced as in the grader."""
    import contextlib
    import io
    import secrets
    import warnings

    import numpy as np

    from mhalib.grade.exercises import all_exercises

    ex, graded = next(((ex, g) for ex in all_exercises().values() for g in ex.graded if g.name == name), (None, None))
    if graded is None:
        print(f"{BAD} score: there is no graded check called {name!r}")
        return 0.0
    if fn is None:
        frame = inspect.currentframe()
        fn = (frame.f_back.f_globals if frame and frame.f_back else {}).get(graded.lookup)
    cases = graded.cases(np.random.default_rng(secrets.randbits(63) if seed is None else seed), _variant_for(ex))
    passed, failures = 0, []
    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():  # stderr fails an nbgrader cell
        warnings.simplefilter("ignore")
        for i, (case, status, message) in enumerate(_outcomes(graded, fn, cases), 1):
            if status == "stop":
                print(f"{BAD} {name}: {message} (0 of {graded.points:g} points)")
                return 0.0
            passed += status == "ok"
            failures += [f"  case {i} ({case.label}): {message}"] if status == "fail" else []
    points = round(graded.points * passed / len(cases), 2)
    print(f"{OK if passed == len(cases) else BAD} {name}: {passed} of {len(cases)} cases correct, "
          f"{points:g} of {graded.points:g} points", *failures[:3], sep="\n")
    return points
