"""Grade one submission: read the notebook, run it in the sandbox, judge every case.

The learner's code runs only in the sandbox's child (:mod:`mhalib.grade.sandbox`);
this module draws the inputs, computes the reference answers from ``mhalib``, compares
and writes the results, in the grader's own process. Nothing here raises on a bad
submission: a truncated file, a crashing or hanging child, a reply that cannot be read,
all end as a result with a reason. Every text that comes from the submission is made
one printable line and cut short before it reaches a report.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mhalib.grade import exercises as registry
from mhalib.grade.sandbox import Limits, Sandbox, decide
from mhalib.grade.spec import explain_error, judge_raised, judge_returned

__all__ = ["CheckResult", "SubmissionResult", "grade_notebook", "load_notebook", "code_cells", "clean"]

MAX_NOTEBOOK_BYTES = 20 << 20
SKIP_TAGS = {"self-check", "grader-skip"}


def clean(text, limit=300):
    """``text`` as one printable line of at most ``limit`` characters (the rest cut, marked)."""
    text = str(text)
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text[: limit * 2])
    return text if len(text) <= limit else text[: limit - 5] + " ..."


@dataclass
class CheckResult:
    name: str
    score: float
    max_score: float
    output: str

    @property
    def status(self):
        return "passed" if self.score >= self.max_score - 1e-9 else "failed"


@dataclass
class SubmissionResult:
    path: str
    exercise: str | None
    checks: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    seed: int | None = None
    seconds: float = 0.0
    isolation: str = ""
    refused: bool = False  # no isolation could be had: not graded, whatever the exercise

    @property
    def graded(self):
        """False when the file was not graded (no exercise, or grading refused): no score to average."""
        return self.exercise is not None and not self.refused

    @property
    def score(self):
        return round(sum(c.score for c in self.checks), 2)

    @property
    def max_score(self):
        return round(sum(c.max_score for c in self.checks), 2)

    def text(self):
        """One line per check, then the total; no line starts with the submission's text."""
        lines = [f"{clean(self.path, 200)}: exercise {self.exercise or '(unknown)'}"]
        width = max([len(c.name) for c in self.checks] + [10])
        for c in self.checks:
            first, *more = c.output.splitlines() or [""]
            lines.append(f"  {'PASS' if c.status == 'passed' else 'FAIL'} {c.name:<{width}} "
                         f"{c.score:5.2f} / {c.max_score:g}  {first}")
            lines += [f"  {'':4} {'':<{width}} {'':13} {extra}" for extra in more]
        lines += [f"  note: {note}" for note in self.notes]
        lines.append(f"  isolation: {self.isolation}")
        lines.append(f"  TOTAL {self.score:g} / {self.max_score:g}" if self.graded
                     else "  NOT GRADED: no score (see the note above)")
        return "\n".join(lines)

    def gradescope(self):
        """Gradescope's results.json for this submission."""
        head = [f"Exercise: {self.exercise or 'unknown'}" + ("" if self.graded else " (NOT GRADED)"),
                *self.notes, f"Isolation: {self.isolation}"]
        return {"score": self.score if self.graded else 0.0, "execution_time": int(round(self.seconds)),
                "output": "\n".join(head), "output_format": "text", "test_output_format": "text",
                "visibility": "visible", "extra_data": {"exercise": self.exercise, "seed": self.seed},
                "tests": [{"name": c.name, "score": round(c.score, 2), "max_score": c.max_score, "status": c.status,
                           "output": c.output, "output_format": "text", "visibility": "visible"}
                          for c in self.checks]}


# ----------------------------------------------------------------------------- notebooks
class NotebookError(Exception):
    pass


def load_notebook(path):
    """The submission as an ``nbformat`` notebook (version 4); :class:`NotebookError` says why not."""
    if "nbformat" not in sys.modules:
        # jsonschema, which nbformat imports, builds a URI grammar when rfc3987-syntax is
        # installed: a second at start-up, for a format the grader never checks.
        sys.modules.setdefault("rfc3987_syntax", None)
    import nbformat

    path = Path(path)
    try:
        if not path.is_file():
            raise NotebookError("it is not a regular file")
        size = path.stat().st_size
        if size > MAX_NOTEBOOK_BYTES:
            raise NotebookError(f"the file is {size >> 20} MiB; notebooks over {MAX_NOTEBOOK_BYTES >> 20} MiB are refused")
        text = path.read_bytes().decode("utf-8")
        data = json.loads(text)
        if not isinstance(data, dict) or not any(isinstance(data.get(k), list) for k in ("cells", "worksheets")):
            raise NotebookError("the file is JSON but not a Jupyter notebook (no list of cells)")
        return nbformat.convert(nbformat.reader.reads(text), 4)  # read, not validated: graded as it is
    except NotebookError:
        raise
    except UnicodeDecodeError:
        raise NotebookError("the file is not a notebook (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise NotebookError(f"the file is not a valid notebook (bad JSON: {clean(exc, 100)}; was it truncated?)") from None
    except Exception as exc:  # noqa: BLE001 - unreadable, nested too deeply, or nbformat's own errors
        raise NotebookError(f"the file is not a valid notebook ({type(exc).__name__}: {clean(exc, 150)})") from None


def code_cells(nb):
    """``[(index, source)]`` of the code cells the grader runs (self-checks skipped)."""
    out = []
    for index, cell in enumerate(c if isinstance(c, dict) else {} for c in nb.get("cells") or []):
        meta, source = cell.get("metadata"), cell.get("source", "")
        tags = meta.get("tags") if isinstance(meta, dict) else None
        source = "".join(s for s in source if isinstance(s, str)) if isinstance(source, list) else source
        if (cell.get("cell_type") == "code" and isinstance(source, str) and source.strip()
                and not (isinstance(tags, list) and SKIP_TAGS & {t for t in tags if isinstance(t, str)})):
            out.append((index, source))
    return out


# ----------------------------------------------------------------------------- grading
def prepare_cases(exercise, rng):
    """``{name: cases or the exception}``: inputs and reference answers, drawn in order."""
    def cases(graded):
        try:
            return graded.make_cases(rng)
        except Exception as exc:  # noqa: BLE001 - the grader's own reference failed: reported per function
            return exc
    return {graded.name: cases(graded) for graded in exercise.graded}


def changed_inputs(after, args, kwargs):
    """Labels of the inputs the call changed: ``after`` is ``[(label, key, array)]`` as the
    child sent them back, compared here with the grader's own originals."""
    changed = []
    for label, key, value in after:
        original = args[key] if isinstance(key, int) and 0 <= key < len(args) else kwargs.get(key)
        if isinstance(original, np.ndarray) and not (
                isinstance(value, np.ndarray) and value.shape == original.shape
                and value.dtype.kind in "biufc" and np.array_equal(value, original, equal_nan=True)):
            changed.append(clean(label, 40))
    return changed


def mutation_message(name, changed):
    return (f"{name} changed its input {', '.join(changed)} in place; work on a copy "
            "(e.g. `z = z.copy()`) and leave the caller's arrays as they were")


def forbidden_message(name, hits):
    library = " (graded code cannot use the course package, mhalib)" if any(h.startswith("mhalib") for h in hits) else ""
    return (f"{name} calls {', '.join(clean(h, 80) for h in hits[:3])}, which this exercise does not allow{library}: "
            "write it yourself. Score 0 for this function.")


def grade_function(sandbox, graded, cases):
    """Run and judge every case of one graded function; returns a :class:`CheckResult`.

    ``cases``: the prepared cases, or the exception raised preparing them.
    """
    name, points = graded.name, float(graded.points)
    if isinstance(cases, Exception):
        return CheckResult(name, 0.0, points, f"the grader could not compute the reference for {name} "
                           f"({type(cases).__name__}: {cases}); tell your instructor")

    def zero(message):
        return CheckResult(name, 0.0, points, message)

    def call(args, kwargs, case=None):
        params = {**graded.params, **(case.params if case else {}), "signature": graded.signature,
                  "arg_names": list(graded.arg_names)}
        return sandbox.call(graded.adapter, graded.lookup, tuple(args), dict(kwargs), params, graded.forbidden)

    def call_again(args, kwargs):  # for explain_error: the plain result, or None
        outcome = call(args, kwargs)
        return outcome.result if outcome.status == "ok" else None

    passed, failures, stop = 0, [], None
    for i, case in enumerate(cases):
        outcome = call(case.args, case.kwargs, case)
        label = f"case {i + 1} ({case.label})" if case.label else f"case {i + 1}"
        message, at = clean(outcome.message), clean(outcome.where, 80)
        if outcome.status == "forbidden":
            return zero(forbidden_message(name, outcome.hits))
        if outcome.status == "ok":
            changed = changed_inputs(outcome.after, case.args, case.kwargs)
            if changed:
                return zero(f"{mutation_message(graded.lookup, changed)}. Score 0 for this function.")
            try:
                problem = judge_returned(case, outcome.result) if case.raises else graded.judge(case, outcome.result)
            except Exception as exc:  # noqa: BLE001 - a judge must not crash the grader on odd results
                problem = f"the result could not be checked ({type(exc).__name__}: {exc})"
            if problem is None:
                passed += 1
            else:
                failures.append(f"{label}: {clean(problem, 400)}")
        elif outcome.status == "exception":
            where = f" at {at}" if at else ""
            if case.raises:
                problem = judge_raised(case, outcome.kinds, f"{message}{where}")
                passed += problem is None
                if problem:
                    failures.append(f"{label}: {graded.lookup} {clean(problem, 400)}")
                continue
            hint = explain_error(graded, case, outcome.message, call_again)
            failures.append(f"{label}: " + (f"{hint} ({name} raised {message}{where})" if hint
                                            else f"{name} raised {message}{where}"))
        elif outcome.status == "not_implemented" or (
                outcome.status == "grading_error" and "was found" in outcome.message
                and any("NotImplementedError" in e for e in sandbox.cell_errors.values())):
            stop, passed = f"{name} is not written yet (it raises NotImplementedError)", 0
            break
        elif outcome.status == "grading_error":
            stop, passed = f"{message}. Score 0 for this function.", 0
            break
        else:  # timeout, died, bad_reply, not_started: the remaining cases are not tried
            stop = f"{label}: {message}; the remaining cases were not run"
            break
    total = len(cases)
    lines = [f"all {total} cases correct" if passed == total else f"{passed} of {total} cases correct"]
    lines += ([stop] if stop else []) + failures[:3]
    if len(failures) > 3:
        lines.append(f"... and {len(failures) - 3} more failing case{'s' if len(failures) > 4 else ''}")
    score = round(points * passed / total, 2) if total else 0.0
    return CheckResult(name, score, points, "\n".join(lines))


def grade_notebook(path, *, seed=None, limits=None, exercise=None, isolation=None, slot=0):
    """Grade one submission; always returns a :class:`SubmissionResult` (never raises).

    ``exercise`` fixes the exercise (the notebook's metadata and name are then ignored);
    ``isolation`` comes from :func:`mhalib.grade.sandbox.decide` (decided here, once per
    process, when not given).
    """
    start = time.monotonic()
    seed = secrets.randbits(63) if seed is None else int(seed)
    result = SubmissionResult(path=str(path), exercise=None, seed=seed)
    try:
        _grade(result, path, limits or Limits(), exercise, isolation or decide(), slot)
    except Exception as exc:  # noqa: BLE001 - a grader fault must still leave a result
        result.notes.append(f"internal grader error ({type(exc).__name__}: {clean(exc)}); tell your instructor")
        result.checks = [CheckResult(c.name, 0.0, c.max_score, "not graded: internal grader error")
                         for c in result.checks]
    result.seconds = time.monotonic() - start
    return result


def _grade(result, path, limits, exercise, isolation, slot):
    result.isolation = isolation.describe(isolation.uid(slot))
    try:
        nb, problem = load_notebook(path), None
    except NotebookError as exc:
        nb, problem = None, str(exc)
    ex = registry.get(exercise) if exercise is not None else registry.recognise(nb and nb.get("metadata"), path)[0]
    if ex is None:
        result.notes.append(f"unknown exercise {clean(exercise, 60)!r}" if exercise is not None else
                            f"could not grade: {problem}" if problem else "could not tell which exercise this is: "
                            "the notebook metadata has no mhalib.exercise and the file name does not start with its number")
        return
    result.exercise = ex.key
    if not isolation.ok:
        result.refused = True
        result.notes.append(f"not graded: the grader refuses to run student code without isolation "
                            f"({isolation.problem})")
        return
    if nb is None:
        result.checks = [CheckResult(g.name, 0.0, float(g.points), f"not a readable notebook: {problem}")
                         for g in ex.graded]
        return
    rng = np.random.default_rng(result.seed)
    sandbox = Sandbox(isolation, code_cells(nb), preload=ex.preload, forbidden=[g.forbidden for g in ex.graded],
                      limits=limits, slot=slot)
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:  # references are computed while the child starts
            prepared = pool.submit(prepare_cases, ex, rng)
            sandbox.start()
            prepared = prepared.result()
        for graded in ex.graded:
            try:
                result.checks.append(grade_function(sandbox, graded, prepared[graded.name]))
            except Exception as exc:  # noqa: BLE001 - a grader bug must still give a result
                result.checks.append(CheckResult(graded.name, 0.0, float(graded.points),
                                                 f"internal grader error ({type(exc).__name__}: {clean(exc)}); "
                                                 "tell your instructor"))
    finally:
        sandbox.close()
    result.notes[:0] = [clean(n, 400) for n in sandbox.notes[:5]]
    errors = [clean(e, 200) for e in sandbox.cell_errors.values()]
    if errors and any(c.status == "failed" for c in result.checks):
        more = [f"... and {len(errors) - 3} more"] if len(errors) > 3 else []
        result.notes.append("errors while running the notebook: " + "; ".join(errors[:3] + more))
    if sandbox.printed:
        result.notes.append(f"the submission printed {sandbox.printed:,} characters while grading "
                            "(printed output is discarded)")
