"""Grade one submission: read the file, have the sandbox's child read and run it, judge every case.

The learner's notebook is read, converted and compiled only in the sandbox's child
(:meth:`mhalib.grade.sandbox.Sandbox.read`), under the child's limits and the
submission's clock: this process reads the file's bytes and nothing of what they hold;
it draws the inputs, computes the reference answers from ``mhalib``, compares and writes
the results. Nothing here raises on a bad submission: a truncated file, a crashing or
hanging child, a reply that cannot be read, all end as a result with a reason. Every text
that comes from the submission is made one printable line and cut short before it
reaches a report.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import secrets
import stat
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mhalib.grade import exercises as registry
from mhalib.grade.sandbox import Limits, Sandbox, decide
from mhalib.grade.spec import Draws, explain_error, fix_draws, judge_raised, judge_returned
# The child's reading of a notebook, named here too (the tests and earlier callers use these names).
from mhalib.grade.worker import (IPYTHON_MAX_CHARS, IPYTHON_MAX_LINES, IPYTHON_MAX_MAGICS,  # noqa: F401
                                 IPYTHON_SECONDS, KEEP_CELL_MAGICS, MAX_CELL_CHARS, MAX_CODE_CELLS, SKIP_TAGS,
                                 NotebookError, _approximate_python, clean, code_cell_labels, code_cells,
                                 syntax_errors, to_python)

__all__ = ["CheckResult", "SubmissionResult", "grade_notebook", "load_notebook", "read_submission",
           "NotebookError", "code_cells", "code_cell_labels", "clean"]

MAX_NOTEBOOK_BYTES = 20 << 20
READ_DEADLINE_S = 10.0  # reading one submission's file


@dataclass
class CheckResult:
    """The result of one graded function: its score out of ``max_score`` and the feedback text."""
    name: str
    score: float
    max_score: float
    output: str

    @property
    def status(self):
        """``"passed"`` when the full score was earned, else ``"failed"``."""
        return "passed" if self.score >= self.max_score - 1e-9 else "failed"


@dataclass
class SubmissionResult:
    """The result of one submission: its checks, notes, seed, run time and isolation."""
    path: str
    exercise: str | None
    checks: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    seed: int | None = None
    seconds: float = 0.0
    isolation: str = ""
    refused: bool = False  # no isolation could be had, or not a regular file: not graded
    # "code cell N (the one starting `...`), line L: message", reported first
    syntax_errors: list = field(default_factory=list)
    unreadable: str = ""  # why the file of a known exercise could not be read as a notebook (it scores 0)
    draws: str = ""  # how the inputs were drawn (fixed for the student, or fresh), and the variant graded
    variant: str = ""  # the code of the variant graded ("" the course's own exercise)
    student: object = field(default=None, repr=False)  # a spec.Draws: the student's ID, the secret

    @property
    def graded(self):
        """False when the file was not graded (no exercise, or grading refused): no score to average."""
        return self.exercise is not None and not self.refused

    @property
    def score(self):
        """The total score of the checks, rounded to two decimals."""
        return round(sum(c.score for c in self.checks), 2)

    @property
    def max_score(self):
        """The most the checks could score, rounded to two decimals."""
        return round(sum(c.max_score for c in self.checks), 2)

    def text(self):
        """One line per check, then the total; no line starts with the submission's text."""
        lines = [f"{clean(self.path, 200)}: exercise {self.exercise or '(unknown)'}"]
        lines += [f"  SYNTAX ERROR in {clean(e, 250)} (that cell did not run; fix it first)" for e in self.syntax_errors]
        width = max([len(c.name) for c in self.checks] + [10])
        for c in self.checks:
            first, *more = c.output.splitlines() or [""]
            lines.append(f"  {'PASS' if c.status == 'passed' else 'FAIL'} {c.name:<{width}} "
                         f"{c.score:5.2f} / {c.max_score:g}  {first}")
            lines += [f"  {'':4} {'':<{width}} {'':13} {extra}" for extra in more]
        lines += [f"  note: {note}" for note in self.notes]
        lines.append(f"  isolation: {self.isolation}")
        lines += [f"  inputs: {self.draws}"] if self.draws else []
        lines.append(f"  TOTAL {self.score:g} / {self.max_score:g}" if self.graded
                     else "  NOT GRADED: no score (see the note above)")
        return "\n".join(lines)

    def gradescope(self):
        """Gradescope's results.json for this submission."""
        head = [f"Exercise: {self.exercise or 'unknown'}" + ("" if self.graded else " (NOT GRADED)"),
                *[f"SYNTAX ERROR in {e} (that cell did not run; fix it first)" for e in self.syntax_errors],
                *self.notes, f"Isolation: {self.isolation}",
                *([f"Inputs: {self.draws}"] if self.draws else [])]
        return {"score": self.score if self.graded else 0.0, "execution_time": int(round(self.seconds)),
                "output": "\n".join(head), "output_format": "text", "test_output_format": "text",
                "visibility": "visible",
                "extra_data": {"exercise": self.exercise, "seed": self.seed, "variant": self.variant},
                "tests": [{"name": c.name, "score": round(c.score, 2), "max_score": c.max_score, "status": c.status,
                           "output": c.output, "output_format": "text", "visibility": "visible"}
                          for c in self.checks]}


# ----------------------------------------------------------------------------- notebooks
class NotRegularFile(NotebookError):
    """A link, a FIFO, a device, a folder or a file of /proc: refused before any read."""


def _kind_of(mode):
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return kind
    return "not a regular file"


@functools.lru_cache(maxsize=None)
def _pseudo_filesystems():
    """Device numbers of /proc, /sys and /dev: their files are never notebooks (reading some
    blocks for ever)."""
    found = {}
    for top in ("/proc", "/sys", "/dev"):
        try:
            found[os.stat(top).st_dev] = top
        except OSError:
            pass
    return found


def read_submission(path, limit=MAX_NOTEBOOK_BYTES, deadline_s=READ_DEADLINE_S):
    """The bytes of the submission at ``path``, read only if it is a regular file of at
    most ``limit`` bytes; :class:`NotebookError` names what it is otherwise.

    The file is opened without following a symbolic link (``O_NOFOLLOW``) and without
    blocking on a FIFO (``O_NONBLOCK``), checked with ``fstat`` (a regular file, not in
    /proc, /sys or /dev), then read to at most ``limit`` bytes within ``deadline_s``.
    """
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            try:
                target = f" (to {clean(os.readlink(path), 120)})"
            except OSError:
                target = ""
            raise NotRegularFile(f"it is a symbolic link{target}; only regular files are graded: submit the notebook "
                                "itself, not a link") from None
        raise NotebookError(f"it cannot be opened ({clean(exc.strerror or exc, 80)})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(f"it is {_kind_of(info.st_mode)}; only regular files are graded")
        if info.st_dev in _pseudo_filesystems():
            raise NotRegularFile(f"it is a file of {_pseudo_filesystems()[info.st_dev]}, not a notebook; only "
                                "regular files are graded")
        if info.st_size > limit:
            raise NotebookError(f"the file is {info.st_size >> 20} MiB; notebooks over {limit >> 20} MiB are refused")
        os.set_blocking(fd, True)
        chunks, box = [], {}

        def read_all():
            try:
                total = 0
                while total <= limit:
                    chunk = os.read(fd, 1 << 20)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    total += len(chunk)
            except OSError as exc:
                box["error"] = exc
        reader = threading.Thread(target=read_all, daemon=True)
        reader.start()
        reader.join(deadline_s)
        if reader.is_alive():  # the descriptor stays with the thread until its read returns
            fd = None
            raise NotebookError(f"reading it took over {deadline_s:g} s; it was left unread")
        if "error" in box:
            raise NotebookError(f"it could not be read ({clean(box['error'], 80)})")
        data = b"".join(chunks)
        if len(data) > limit:
            raise NotebookError(f"the file is over {limit >> 20} MiB; notebooks over {limit >> 20} MiB are refused")
        return data
    finally:
        if fd is not None:
            os.close(fd)


def load_notebook(path, data=None):
    """The submission as an ``nbformat`` notebook (version 4); :class:`NotebookError` says why not.
    ``data``: its bytes, when already read with :func:`read_submission`. It parses the file in
    the calling process: grading never calls it (the sandbox's child reads the notebook)."""
    if "nbformat" not in sys.modules:
        # jsonschema, which nbformat imports, builds a URI grammar when rfc3987-syntax is
        # installed: a second at start-up, for a format the grader never checks.
        sys.modules.setdefault("rfc3987_syntax", None)
    import nbformat

    try:
        text = (read_submission(path) if data is None else data).decode("utf-8")
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


# The sandbox and its child name a cell by its index: "cell 7 ...", "cell 7, line 3: ...",
# "line 3 of cell 7: ..." (always at the start of their own messages, before any text of the submission).
_CELL_AT_START = re.compile(r"(?:line (?P<before>\d+) of )?cell (?P<index>\d+)\b(?:, line (?P<after>\d+))?")


def relocate(text, labels):
    """``text`` with the cell reference it starts with (``cell 7``, ``cell 7, line 3``,
    ``line 3 of cell 7``) as the learner sees that cell: ``code cell 4 (the one starting `def
    f(x):`), line 3``; any other text unchanged. ``labels``: :func:`code_cell_labels`."""
    text = str(text)
    found = _CELL_AT_START.match(text)
    if not found or int(found["index"]) not in labels:
        return text
    line = found["before"] or found["after"]
    return labels[int(found["index"])] + (f", line {line}" if line else "") + text[found.end():]


# ----------------------------------------------------------------------------- grading
def prepare_cases(exercise, rng, variant=None):
    """``{name: cases or the exception}``: inputs and reference answers, drawn in order."""
    def cases(graded):
        try:
            return graded.cases(rng, variant)
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
    """The feedback when ``name`` changed the inputs ``changed`` (their labels) in place."""
    return (f"{name} changed its input {', '.join(changed)} in place; work on a copy "
            "(e.g. `z = z.copy()`) and leave the caller's arrays as they were")


def forbidden_message(name, hits):
    """The feedback when ``name`` calls the forbidden callables ``hits``; it scores 0."""
    library = " (graded code cannot use the course package, mhalib)" if any(h.startswith("mhalib") for h in hits) else ""
    return (f"{name} calls {', '.join(clean(h, 80) for h in hits[:3])}, which this exercise does not allow{library}: "
            "write it yourself. Score 0 for this function.")


def judge_outcome(graded, case, outcome, call_again):
    """The verdict on one case from what the learner's function did: the one judging step of
    the grader (:func:`grade_function`, in its sandbox) and of ``check()`` and ``score()``
    (:mod:`mhalib.grade.check`, in the learner's kernel).

    Args:
        graded: the :class:`~mhalib.grade.spec.Graded` function.
        case: the case that was run.
        outcome: a :class:`~mhalib.grade.sandbox.CallOutcome`: ``ok`` (with the plain result
            and the inputs after the call), ``exception``, ``forbidden``, ``not_implemented``,
            ``grading_error``, or a failure to run (``timeout``, ``died``, ...).
        call_again: ``fn(args, kwargs)`` -> the plain result or ``None``, for
            ``explain_error`` to try the learner's function on other inputs.

    Returns:
        ``(verdict, message)``: ``"pass"`` (message ``None``), ``"fail"`` (this case is wrong:
        why), ``"zero"`` (the function scores 0 whatever its other cases: a forbidden call,
        inputs changed in place) or ``"stop"`` (no later case can be judged: why).
    """
    name = graded.name
    message, at = clean(outcome.message), clean(outcome.where, 120)  # a code cell named as the learner sees it
    if outcome.status == "forbidden" and case.must_call and set(outcome.hits) <= {case.must_call}:
        return "pass", None  # the one call this case forbids, to see that it is made: it was
    if outcome.status == "forbidden":
        return "zero", forbidden_message(name, outcome.hits)
    if outcome.status == "ok":
        changed = changed_inputs(outcome.after, case.args, case.kwargs)
        if changed:
            return "zero", f"{mutation_message(graded.lookup, changed)}. Score 0 for this function."
        try:
            problem = judge_returned(case, outcome.result) if case.raises else graded.judge(case, outcome.result)
        except Exception as exc:  # noqa: BLE001 - a judge must not crash the grader on odd results
            problem = f"the result could not be checked ({type(exc).__name__}: {exc})"
        return ("pass", None) if problem is None else ("fail", clean(problem, 400))
    if outcome.status == "exception":
        where = f" at {at}" if at else ""
        if case.raises:
            problem = judge_raised(case, outcome.kinds, f"{message}{where}")
            return ("pass", None) if problem is None else ("fail", f"{graded.lookup} {clean(problem, 400)}")
        hint = explain_error(graded, case, outcome.message, call_again)
        return "fail", (f"{hint} ({name} raised {message}{where})" if hint else f"{name} raised {message}{where}")
    if outcome.status == "not_implemented":
        return "stop", f"{graded.lookup} is not written yet (it raises NotImplementedError)"
    if outcome.status == "grading_error":
        return "stop", f"{message}. Score 0 for this function."
    return "stop", message  # it did not run to the end: the caller names the case


def grade_function(sandbox, graded, cases, labels=None):
    """Run and judge every case of one graded function; returns a :class:`CheckResult`.

    ``cases``: the prepared cases, or the exception raised preparing them; ``labels``:
    :func:`code_cell_labels`, to name the cell where the learner's code raised as they see it.
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
        forbidden = graded.forbidden if case is None or case.forbidden is None else case.forbidden
        outcome = sandbox.call(graded.adapter, graded.lookup, tuple(args), dict(kwargs), params, forbidden)
        if labels and outcome.where:
            outcome.where = relocate(outcome.where, labels)
        return outcome

    def call_again(args, kwargs):  # for explain_error: the plain result, or None
        outcome = call(args, kwargs)
        return outcome.result if outcome.status == "ok" else None

    passed, failures, stop = 0, [], None
    for i, case in enumerate(cases):
        outcome = call(case.args, case.kwargs, case)
        if outcome.status == "grading_error" and "was found" in outcome.message and any(
                "NotImplementedError" in e for e in sandbox.cell_errors.values()):
            outcome.status = "not_implemented"  # the cell defining it raised: the untouched exercise
        label = f"case {i + 1} ({case.label})" if case.label else f"case {i + 1}"
        verdict, message = judge_outcome(graded, case, outcome, call_again)
        if verdict == "pass":
            passed += 1
        elif verdict == "fail":
            failures.append(f"{label}: {message}")
        elif verdict == "zero":
            return zero(message)
        else:
            if outcome.status in ("not_implemented", "grading_error"):
                stop, passed = message, 0
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


def grade_notebook(path, *, seed=None, limits=None, exercise=None, isolation=None, slot=0, student=None):
    """Grade one submission; always returns a :class:`SubmissionResult` (never raises).

    ``exercise`` fixes the exercise (the notebook's metadata and name are then ignored);
    ``isolation`` comes from :func:`mhalib.grade.sandbox.decide` (decided here, once per
    process, when not given). Once the exercise is known every one of its checks is
    listed with its points, whatever happens. ``student`` (a :class:`mhalib.grade.spec.Draws`)
    fixes the draws for the student with the instructor's secret and picks their variant.
    """
    start = time.monotonic()
    given = seed is not None
    seed = secrets.randbits(63) if seed is None else int(seed)
    result = SubmissionResult(path=str(path), exercise=None, seed=seed)
    result.student = student or Draws(seed_given=given)  # the student's seed and variant: spec.fix_draws
    ex = None
    try:
        ex = _grade(result, path, limits or Limits(), exercise, isolation or decide(), slot)
    except Exception as exc:  # noqa: BLE001 - a grader fault must still leave a result
        result.notes.append(f"internal grader error ({type(exc).__name__}: {clean(exc)}); tell your instructor")
    if ex is not None and result.graded:  # every check listed: none silently missing
        have = {c.name for c in result.checks}
        result.checks += [CheckResult(g.name, 0.0, float(g.points), "not graded: the grading of this submission "
                                      "stopped before this function (see the notes)")
                          for g in ex.graded if g.name not in have]
    result.seconds = time.monotonic() - start
    return result


def _grade(result, path, limits, exercise, isolation, slot):
    """Fill ``result``; returns the exercise once known (else ``None``)."""
    result.isolation = isolation.describe(isolation.uid(slot), limits)
    try:
        data, problem = read_submission(path), None
    except NotRegularFile as exc:  # refused by what it is, before any read: never graded
        result.refused = True
        result.notes.append(f"refused before reading: {exc}")
        return None
    except NotebookError as exc:
        data, problem = None, str(exc)
    fixed = registry.get(exercise) if exercise is not None else None
    if exercise is not None and fixed is None:
        result.notes.append(f"unknown exercise {clean(exercise, 60)!r}")
        return None
    if not isolation.ok:  # no child to read the notebook: the exercise from the command line or the name
        ex = fixed or registry.recognise(None, path)[0]
        result.exercise, result.refused = ex.key if ex else None, True
        result.notes.append(f"not graded: the grader refuses to run student code without isolation "
                            f"({isolation.problem})")
        return ex
    sandbox = Sandbox(isolation, limits=limits, slot=slot)
    try:
        reading = sandbox.read(data) if data is not None else None
        hint = {"mhalib": {"exercise": reading.exercise}} if reading is not None and reading.exercise else None
        ex = fixed or registry.recognise(hint, path)[0]
        problem = problem or (reading.problem or reading.failure if reading is not None else "")
        if ex is None:
            result.notes.append(f"could not grade: {problem}" if problem else "could not tell which exercise this "
                                "is: the notebook metadata has no mhalib.exercise and the file name does not start "
                                "with its number")
            return None
        result.exercise = ex.key
        if problem:  # not a notebook (it scores 0), or the child could not read it (each check says why)
            if reading is None or reading.problem:
                result.unreadable = problem
                why = f"not a readable notebook: {problem}"
            else:
                why = f"not run: {problem}"
                result.notes.append(problem)
            result.checks = [CheckResult(g.name, 0.0, float(g.points), why) for g in ex.graded]
            return ex
        _run(result, ex, sandbox, reading)
    finally:
        sandbox.close()
    return ex


def _run(result, ex, sandbox, reading):
    """Run the cells ``reading`` gives in the ``sandbox``'s child and grade every function of ``ex``."""
    labels, broken = reading.labels, reading.syntax
    result.syntax_errors = [labels.get(index, f"cell {index}") + (f", line {line}" if line else "") + f": {message}"
                            for index, line, message in broken]
    variant = fix_draws(result, ex)  # fixed for the student by the instructor's secret, or fresh; the variant
    rng = np.random.default_rng(result.seed)
    sandbox.prepare(reading.cells, ex.preload, [g.forbidden for g in ex.graded])
    with ThreadPoolExecutor(max_workers=1) as pool:  # references are computed while the child sets up
        prepared = pool.submit(prepare_cases, ex, rng, variant)
        sandbox.start()
        prepared = prepared.result()
    for graded in ex.graded:
        try:
            check = grade_function(sandbox, graded, prepared[graded.name], labels)
        except Exception as exc:  # noqa: BLE001 - a grader bug must still give a result
            check = CheckResult(graded.name, 0.0, float(graded.points),
                                f"internal grader error ({type(exc).__name__}: {clean(exc)}); tell your instructor")
        if broken and check.score < check.max_score and "was found" in check.output:
            index, line, message = broken[0]
            check.output = "\n".join([f"{graded.lookup} was not defined: {labels.get(index, f'cell {index}')}"
                                       + (f", line {line}" if line else "") + f" has a syntax error ({message}), "
                                       "so that cell did not run"]
                                      + [x for x in check.output.splitlines() if "was found" not in x])
        result.checks.append(check)
    sandbox.close()
    result.notes[:0] = [clean(relocate(n, labels), 400) for n in (reading.notes + sandbox.notes)[:5]]
    errors = [clean(relocate(e, labels), 260) for i, e in sandbox.cell_errors.items()
              if i not in {b[0] for b in broken}]
    if errors and any(c.status == "failed" for c in result.checks):
        more = [f"... and {len(errors) - 3} more"] if len(errors) > 3 else []
        result.notes.append("errors while running the notebook: " + "; ".join(errors[:3] + more))
    if sandbox.printed:
        result.notes.append(f"the submission printed {sandbox.printed:,} characters while grading "
                            "(printed output is discarded)")
