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
"""

from __future__ import annotations

import inspect

__all__ = ["check", "graded_names"]

OK, BAD = "\u2714", "\u2718"


def graded_names():
    """Every name ``check`` knows, in exercise order."""
    from mhalib.grade.exercises import all_exercises

    names = []
    for ex in all_exercises().values():
        for g in ex.graded:
            if g.lookup not in names:
                names.append(g.lookup)
    return names


def _plain(result):
    """The result as the grader would receive it: plain arrays, numbers and tuples."""
    from mhalib.grade import calling, protocol

    arrays = []
    return protocol.decode_value(protocol.encode_value(calling.to_plain(result), arrays), arrays)


def _run_case(graded, fn, case):
    """``("ok", None)`` when the case passes, else ``("fail" or "stop", message)``."""
    from mhalib.grade import calling, spec

    ns = dict(getattr(fn, "__globals__", {}) or {})
    if isinstance(fn, type):
        import sys

        module = sys.modules.get(getattr(fn, "__module__", ""), None)
        ns.update(vars(module) if module is not None else {})
    ns[graded.lookup] = fn
    params = {**graded.params, **case.params, "signature": graded.signature,
              "arg_names": list(graded.arg_names)}
    try:
        result, hits, tampered, after = calling.call(graded.adapter, ns, graded.lookup, case.args,
                                                     case.kwargs, params, graded.forbidden)
    except NotImplementedError:
        return "stop", f"{graded.lookup} is not written yet (it raises NotImplementedError)"
    except calling.GradingError as exc:
        return "stop", str(exc)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - report, never raise
        text = str(exc)
        error = f"{type(exc).__name__}" + (f": {text[:400]}" if text else "")
        if case.raises:
            problem = spec.judge_raised(case, [c.__name__ for c in type(exc).__mro__], error)
            return ("ok", None) if problem is None else ("fail", problem)

        def call(args, kwargs):  # the learner's function once more, for explain_error
            try:
                return _plain(calling.call(graded.adapter, ns, graded.lookup, args, kwargs, params,
                                           graded.forbidden)[0])
            except (Exception, SystemExit):  # noqa: BLE001
                return None

        hint = spec.explain_error(graded, case, error, call)
        return "fail", (f"{hint} (it raised {error})" if hint else f"raised {error}")
    if hits:
        return "stop", (f"{graded.lookup} calls {', '.join(hits[:3])}, which this exercise does not "
                        "allow (the grader gives 0 for it): write it yourself")
    if tampered:
        return "stop", f"{graded.lookup} switched off call tracing (sys.setprofile); the grader gives 0"
    changed = calling.changed_inputs(after, case.args, case.kwargs)
    if changed:
        return "stop", calling.mutation_message(graded.lookup, changed)
    plain = _plain(result)
    problem = spec.judge_returned(case, plain) if case.raises else graded.judge(case, plain)
    return ("ok", None) if problem is None else ("fail", problem)


def _check_one(graded, fn):
    try:
        cases = graded.visible_cases()
    except Exception as exc:  # noqa: BLE001
        return False, f"the visible tests for {graded.name} could not be prepared ({type(exc).__name__}: {exc})"
    for i, case in enumerate(cases, 1):
        try:
            status, message = _run_case(graded, fn, case)
        except Exception as exc:  # noqa: BLE001 - a check must never crash the notebook
            status, message = "fail", f"could not be checked ({type(exc).__name__}: {exc})"
        if status == "stop":
            return False, message
        if status == "fail":
            label = f" ({case.label})" if case.label else ""
            return False, f"visible test {i} of {len(cases)}{label}: {message}"
    return True, f"all {len(cases)} visible tests pass (the grader will use new inputs)"


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
    for _, graded in entries:
        ok, message = _check_one(graded, fn)
        all_ok &= ok
        print(f"{OK if ok else BAD} {graded.name}: {message}")
    return all_ok
