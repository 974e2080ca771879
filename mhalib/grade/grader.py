"""Grade one submission: read the notebook, run it in the sandbox, judge every case.

The learner's code runs only in the child process (:mod:`mhalib.grade.sandbox`);
this module draws the inputs, computes the reference answers from ``mhalib``,
compares, and writes the results. Nothing here raises on a bad submission: a
truncated file, a crashing kernel or a hanging function all end as a scored result
with a message.
"""

from __future__ import annotations

import json
import secrets
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mhalib.grade import calling, protocol
from mhalib.grade import exercises as registry
from mhalib.grade.sandbox import Limits, Sandbox
from mhalib.grade.spec import explain_error, judge_raised, judge_returned

__all__ = ["CheckResult", "SubmissionResult", "grade_notebook", "load_notebook", "code_cells"]

MAX_NOTEBOOK_BYTES = 20 << 20
SKIP_TAGS = {"self-check", "grader-skip"}


@dataclass
class CheckResult:
    name: str
    score: float
    max_score: float
    output: str
    passed_cases: int = 0
    total_cases: int = 0

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
    max_score_if_unknown: float = 0.0

    @property
    def graded(self):
        """False when the file is none of the course's exercises: it has no score to average."""
        return self.exercise is not None

    @property
    def score(self):
        return round(sum(c.score for c in self.checks), 2)

    @property
    def max_score(self):
        if self.checks:
            return round(sum(c.max_score for c in self.checks), 2)
        return self.max_score_if_unknown

    def text(self):
        """What the grader prints: one line per check, then the total."""
        lines = [f"{self.path}: exercise {self.exercise or '(unknown)'}"]
        width = max([len(c.name) for c in self.checks] + [10])
        for c in self.checks:
            mark = "PASS" if c.status == "passed" else "FAIL"
            lines.append(f"  {mark} {c.name:<{width}} {c.score:5.2f} / {c.max_score:g}  {c.output.splitlines()[0] if c.output else ''}")
            for extra in c.output.splitlines()[1:]:
                lines.append(f"  {'':4} {'':<{width}} {'':13} {extra}")
        for note in self.notes:
            lines.append(f"  note: {note}")
        if self.graded:
            lines.append(f"  TOTAL {self.score:g} / {self.max_score:g}")
        else:
            lines.append("  NOT GRADED: no score (see the note above)")
        return "\n".join(lines)

    def gradescope(self):
        """Gradescope's results.json structure."""
        return {
            "score": self.score,
            "output": "\n".join([f"Exercise: {self.exercise or 'unknown'}", *self.notes]),
            "tests": [
                {"name": c.name, "score": round(c.score, 2), "max_score": c.max_score,
                 "status": c.status, "output": c.output}
                for c in self.checks
            ],
        }


# ----------------------------------------------------------------------------- notebooks
class NotebookError(Exception):
    pass


def load_notebook(path):
    """Parse a submission as a notebook dict; raises :class:`NotebookError` with a plain reason."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise NotebookError(f"cannot read the file ({exc.strerror or exc})") from None
    if size > MAX_NOTEBOOK_BYTES:
        raise NotebookError(f"the file is {size >> 20} MiB; notebooks over {MAX_NOTEBOOK_BYTES >> 20} MiB are refused")
    try:
        raw = path.read_bytes()
        nb = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise NotebookError("the file is not a notebook (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise NotebookError(f"the file is not a valid notebook (JSON error at line {exc.lineno}: "
                            f"{exc.msg}; was it truncated?)") from None
    except (OSError, RecursionError) as exc:
        raise NotebookError(f"cannot read the file ({exc})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise NotebookError("the file is JSON but not a Jupyter notebook (no list of cells)")
    return nb


def code_cells(nb):
    """``[(index, source)]`` of the code cells the grader runs (self-checks skipped)."""
    out = []
    for index, cell in enumerate(nb.get("cells", [])):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata") if isinstance(cell.get("metadata"), dict) else {}
        tags = meta.get("tags") if isinstance(meta.get("tags"), list) else []
        if SKIP_TAGS & {t for t in tags if isinstance(t, str)}:
            continue
        src = cell.get("source", "")
        if isinstance(src, list):
            src = "".join(s for s in src if isinstance(s, str))
        if not isinstance(src, str) or not src.strip():
            continue
        out.append((index, src))
    return out


# ----------------------------------------------------------------------------- grading
def _plural(n, word):
    return f"{n} {word}{'' if n == 1 else 's'}"


def _forbidden_message(name, hits):
    shown = ", ".join(hits[:3])
    return (f"{name} calls {shown}, which this exercise does not allow: write it yourself. "
            "Score 0 for this function.")


def prepare_cases(exercise, rng):
    """``{name: cases or the exception}``: inputs and reference answers, drawn in order."""
    prepared = {}
    for graded in exercise.graded:
        try:
            prepared[graded.name] = graded.make_cases(rng)
        except Exception as exc:  # the grader's own reference failed: reported per function
            prepared[graded.name] = exc
    return prepared


def _caller(sandbox, graded):
    """``call(args, kwargs)`` for an exercise's ``explain_error``: the plain result, or ``None``."""
    def call(args, kwargs):
        params = {**graded.params, "signature": graded.signature, "arg_names": list(graded.arg_names)}
        outcome = sandbox.call(graded.adapter, graded.lookup, tuple(args), dict(kwargs), params,
                               graded.forbidden, protocol.encode_value)
        return outcome.result if outcome.status == "ok" else None
    return call


def grade_function(sandbox, graded, rng=None, cases=None):
    """Run and judge every case of one graded function; returns a :class:`CheckResult`.

    ``cases`` are the prepared cases (or the exception raised preparing them); without
    them they are drawn from ``rng``.
    """
    name = graded.name
    if cases is None:
        try:
            cases = graded.make_cases(rng)
        except Exception as exc:
            cases = exc
    if isinstance(cases, Exception):
        exc = cases
        return CheckResult(name, 0.0, float(graded.points),
                           f"the grader could not compute the reference for {name} "
                           f"({type(exc).__name__}: {exc}); tell your instructor")
    passed, failures, stop = 0, [], None
    dropped = 0
    for i, case in enumerate(cases):
        params = {**graded.params, **case.params, "signature": graded.signature,
                  "arg_names": list(graded.arg_names)}
        outcome = sandbox.call(graded.adapter, graded.lookup, case.args, case.kwargs, params,
                               graded.forbidden, protocol.encode_value)
        dropped += outcome.output_dropped
        label = f"case {i + 1} ({case.label})" if case.label else f"case {i + 1}"
        if outcome.status == "ok":
            if outcome.hits:
                return CheckResult(name, 0.0, float(graded.points), _forbidden_message(name, outcome.hits),
                                   0, len(cases))
            changed = calling.changed_inputs(outcome.after, case.args, case.kwargs)
            if changed:
                return CheckResult(name, 0.0, float(graded.points),
                                   f"{calling.mutation_message(graded.lookup, changed)}. Score 0 for this function.",
                                   0, len(cases))
            if outcome.tampered:
                return CheckResult(name, 0.0, float(graded.points),
                                   f"{name} switched off the grader's call tracing (sys.setprofile); score 0",
                                   0, len(cases))
            if case.raises:
                problem = judge_returned(case, outcome.result)
            else:
                try:
                    problem = graded.judge(case, outcome.result)
                except Exception as exc:  # a judge must not crash the grader on odd results
                    problem = f"the result could not be checked ({type(exc).__name__}: {exc})"
            if problem is None:
                passed += 1
            else:
                failures.append(f"{label}: {problem}")
            continue
        if outcome.status == "not_implemented":
            stop = f"{name} is not written yet (it raises NotImplementedError)"
            break
        if outcome.status == "grading_error" and "was found" in outcome.message and any(
                "NotImplementedError" in e for errs in sandbox.cell_errors.values() for e in errs):
            stop = f"{name} is not written yet (its cell raises NotImplementedError)"
            passed = 0
            break
        if outcome.status == "grading_error":
            # missing function, wrong signature, input changed in place, wrong kind of
            # object: the function as a whole does not do what the exercise asks
            stop = f"{outcome.message}. Score 0 for this function."
            passed = 0
            break
        if outcome.status == "exception":
            where = f" at {outcome.where}" if outcome.where else ""
            if case.raises:
                problem = judge_raised(case, outcome.kinds, f"{outcome.message}{where}")
                if problem is None:
                    passed += 1
                else:
                    failures.append(f"{label}: {graded.lookup} {problem}")
                continue
            hint = explain_error(graded, case, outcome.message, _caller(sandbox, graded))
            if hint:
                failures.append(f"{label}: {hint} ({name} raised {outcome.message}{where})")
            else:
                failures.append(f"{label}: {name} raised {outcome.message}{where}")
            continue
        # timeout, died, bad_reply: the child was killed; do not try this function again
        stop = f"{label}: {outcome.message}; the remaining cases were not run"
        break
    total = len(cases)
    score = round(float(graded.points) * passed / total, 2) if total else 0.0
    lines = []
    if stop:
        lines.append(stop)
    lines += failures[:3]
    if len(failures) > 3:
        lines.append(f"... and {_plural(len(failures) - 3, 'more failing case')}")
    if passed == total:
        lines.insert(0, f"all {total} cases correct")
    else:
        lines.insert(0, f"{passed} of {total} cases correct")
    if dropped:
        lines.append(f"(printed more than 64 KiB while grading; {dropped} characters were discarded)")
    return CheckResult(name, score, float(graded.points), "\n".join(lines), passed, total)


def grade_notebook(path, *, seed=None, limits=None, exercise=None):
    """Grade one submission; always returns a :class:`SubmissionResult` (never raises)."""
    try:
        return _grade_notebook(path, seed=seed, limits=limits, exercise=exercise)
    except Exception as exc:  # a grader fault must still leave a result to write
        result = SubmissionResult(path=str(path), exercise=None, seed=seed)
        result.notes.append(f"internal grader error ({type(exc).__name__}: {exc}); tell your instructor")
        return result


def _grade_notebook(path, *, seed=None, limits=None, exercise=None):
    start = time.monotonic()
    seed = secrets.randbits(63) if seed is None else int(seed)
    result = SubmissionResult(path=str(path), exercise=None, seed=seed)
    try:
        nb = load_notebook(path)
    except NotebookError as exc:
        nb = None
        result.notes.append(f"could not grade: {exc}")
    ex = None
    if exercise is not None:
        ex = registry.get(exercise)
        if ex is None:
            result.notes.append(f"unknown exercise {exercise!r}")
    else:
        ex, _ = registry.recognise(nb.get("metadata") if nb else None, path)
        if ex is None:
            result.notes.append("could not tell which exercise this is: the notebook metadata has no "
                                "mhalib.exercise and the file name does not start with its number")
    if ex is None:
        result.seconds = time.monotonic() - start
        return result
    result.exercise = ex.key
    if nb is None:
        result.checks = [CheckResult(g.name, 0.0, float(g.points), "not graded: the file is not a readable notebook")
                         for g in ex.graded]
        result.seconds = time.monotonic() - start
        return result
    rng = np.random.default_rng(seed)
    sandbox = Sandbox(code_cells(nb), preload=ex.preload, limits=limits or Limits())
    try:
        # the references (which may import torch here) are computed while the child starts
        with ThreadPoolExecutor(max_workers=1) as pool:
            prepared = pool.submit(prepare_cases, ex, rng)
            sandbox.start()
            prepared = prepared.result()
        for graded in ex.graded:
            try:
                result.checks.append(grade_function(sandbox, graded, cases=prepared[graded.name]))
            except Exception as exc:  # a grader bug must still give a result
                result.checks.append(CheckResult(
                    graded.name, 0.0, float(graded.points),
                    f"internal grader error ({type(exc).__name__}: {exc}); tell your instructor"))
                result.notes.append(traceback.format_exc(limit=3))
    finally:
        sandbox.close()
    result.notes[:0] = sandbox.notes
    errors = [e for errs in sandbox.cell_errors.values() for e in errs]
    if errors and any(c.status == "failed" for c in result.checks):
        shown = errors[:3] + ([f"... and {len(errors) - 3} more"] if len(errors) > 3 else [])
        result.notes.append("errors while running the notebook: " + "; ".join(shown))
    result.seconds = time.monotonic() - start
    return result
