"""Generate the exercise notebooks from the solution notebooks (one source).

Usage::

    python -m mhalib.grade.release                  # every solutions/*.ipynb
    python -m mhalib.grade.release solutions/01_single_head_attention.ipynb
    python -m mhalib.grade.release --check          # exit 1 if exercises/ is stale
    python -m mhalib.grade.release --force          # also overwrite exercises someone changed

An exercise is only overwritten when nobody changed it: when it is what this generator
makes from the solution as it is now, or as it was in the last commit. Anything else (a
learner's work, a hand edit) is left as it is, named, and the exit status is 1.

``solutions/NN_topic.ipynb`` becomes ``exercises/NN_topic.ipynb``:

* in code cells, everything from ``### BEGIN SOLUTION`` to ``### END SOLUTION``
  (markers included) becomes ``raise NotImplementedError(...)`` at the marker's
  indentation, after a ``# YOUR CODE HERE`` line (the nbgrader convention);
* in markdown cells, the same region becomes ``YOUR ANSWER HERE``;
* ``### BEGIN HIDDEN TESTS`` .. ``### END HIDDEN TESTS`` regions are removed;
* outputs and execution counts are cleared;
* cells that held a solution, and cells tagged ``self-check``, are tagged
  ``raises-exception`` so that the untouched exercise still runs top to bottom;
* notebook metadata (``{"mhalib": {"exercise": ...}}``, kernelspec, ...) is kept.

The output depends only on the input: the same solution gives the same bytes.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

__all__ = ["release_notebook", "release_text", "exercise_path", "main"]

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
BEGIN_HIDDEN = "### BEGIN HIDDEN TESTS"
END_HIDDEN = "### END HIDDEN TESTS"
SELF_CHECK_TAG = "self-check"
RAISES_TAG = "raises-exception"
ANSWER_PLACEHOLDER = "YOUR ANSWER HERE"

_DEF = re.compile(r"^\s*(?:async\s+)?def\s+([A-Za-z_]\w*)\s*\(")
_CLASS = re.compile(r"^\s*class\s+([A-Za-z_]\w*)\b")

# Cell metadata that only describes one run of the solution (not worth shipping).
_RUN_METADATA = ("execution", "ExecuteTime")


class ReleaseError(ValueError):
    """A solution notebook that cannot be turned into an exercise (e.g. unbalanced markers)."""


def _stub_message(lines, index):
    """A helpful message naming the function (or method of a class) the stub sits in."""
    func = cls = None
    indent = len(lines[index]) - len(lines[index].lstrip())
    for line in reversed(lines[:index]):
        stripped = line.lstrip()
        if not stripped or stripped.startswith("#"):
            continue
        ind = len(line) - len(stripped)
        if ind >= indent:
            continue
        m = _DEF.match(line)
        if m and func is None:
            func, indent = m.group(1), ind
            continue
        m = _CLASS.match(line)
        if m:
            cls = m.group(1)
            break
        indent = ind
    where = f"{cls}.{func}" if func and cls else func or cls
    return f"{where + ' is not' if where else 'not'} written yet: replace this line with your code"


def release_text(text, *, kind="code", where="cell"):
    """Replace solution regions in one cell's source.

    Returns ``(new_text, had_solution)``. Raises :class:`ReleaseError` on unbalanced
    markers, naming ``where``.
    """
    lines, out, had_solution, i = text.splitlines(keepends=True), [], False, 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith(BEGIN_SOLUTION) or stripped.startswith(BEGIN_HIDDEN):
            hidden = stripped.startswith(BEGIN_HIDDEN)
            end_marker = END_HIDDEN if hidden else END_SOLUTION
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(end_marker):
                stripped_j = lines[j].strip()
                if stripped_j.startswith(BEGIN_SOLUTION) or stripped_j.startswith(BEGIN_HIDDEN):
                    raise ReleaseError(f"{where}: nested {stripped_j!r} inside a region opened on line {i + 1}")
                j += 1
            if j == len(lines):
                raise ReleaseError(f"{where}: {stripped!r} on line {i + 1} has no matching {end_marker!r}")
            indent = line[: len(line) - len(line.lstrip())]
            newline = "\n" if lines[j].endswith("\n") else ""
            if not hidden:
                had_solution = True
                out.append(f"{indent}# YOUR CODE HERE\n{indent}raise NotImplementedError({_stub_message(lines, i)!r})"
                           f"{newline}" if kind == "code" else f"{indent}{ANSWER_PLACEHOLDER}{newline}")
            i = j + 1
            continue
        if stripped.startswith(END_SOLUTION) or stripped.startswith(END_HIDDEN):
            raise ReleaseError(f"{where}: {stripped!r} on line {i + 1} has no opening marker")
        out.append(line)
        i += 1
    return "".join(out), had_solution


def release_notebook(nb, *, name="notebook"):
    """Return the exercise version of a solution notebook (a dict, as read from JSON)."""
    nb = json.loads(json.dumps(nb))  # a deep copy made of plain JSON types
    nb.get("metadata", {}).pop("widgets", None)
    for index, cell in enumerate(nb.get("cells", [])):
        kind = cell.get("cell_type")
        meta = cell.setdefault("metadata", {})
        if nb.get("nbformat", 4) >= 4 and nb.get("nbformat_minor", 0) >= 5 and not cell.get("id"):
            cell["id"] = f"cell-{index}"  # deterministic, unlike a random id
        for key in _RUN_METADATA:
            meta.pop(key, None)
        had_solution = False
        if kind in ("code", "markdown"):
            source = cell.get("source", "")
            text, had_solution = release_text("".join(source) if isinstance(source, list) else source, kind=kind,
                                              where=f"{name}, cell {index}")
            cell["source"] = text.splitlines(keepends=True)  # Jupyter's on-disk form
        if kind == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
            tags = meta.get("tags", [])
            if (had_solution or SELF_CHECK_TAG in tags) and RAISES_TAG not in tags:
                meta["tags"] = [*tags, RAISES_TAG]
    return nb


def dumps(nb):
    """Serialise as Jupyter does (1-space indent, sorted keys, UTF-8, final newline)."""
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def exercise_path(solution_path, out_dir=None):
    """``solutions/NN_topic.ipynb`` -> ``exercises/NN_topic.ipynb`` (next to ``solutions/``)."""
    solution_path = Path(solution_path)
    out_dir = Path(out_dir) if out_dir else solution_path.resolve().parent.parent / "exercises"
    return out_dir / solution_path.name


def render(solution_path):
    """The exercise notebook's text for one solution file."""
    solution_path = Path(solution_path)
    try:
        nb = json.loads(solution_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReleaseError(f"{solution_path}: not a readable notebook ({exc})") from exc
    return dumps(release_notebook(nb, name=str(solution_path)))


def committed_text(path):
    """``path`` as the last commit holds it (``None`` outside a git checkout, or when it is new)."""
    path = Path(path).resolve()
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=path.parent, capture_output=True,
                             text=True, timeout=20)
        if top.returncode != 0:
            return None
        rel = path.relative_to(Path(top.stdout.strip()).resolve()).as_posix()
        shown = subprocess.run(["git", "show", f"HEAD:{rel}"], cwd=path.parent, capture_output=True, timeout=20)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return shown.stdout.decode("utf-8", "replace") if shown.returncode == 0 else None


def untouched(current, text, src):
    """Whether the exercise ``current`` is one this generator made (from the solution ``src``
    as it is now, giving ``text``, or as it was in the last commit): nobody has changed it."""
    if current is None or current == text:
        return True
    before = committed_text(src)
    if before is None:
        return False
    try:
        return current == dumps(release_notebook(json.loads(before), name=str(src)))
    except (ValueError, ReleaseError):
        return False


def main(argv=None):
    """Generate the exercise notebooks from the solutions, or check them with ``--check``.

    Returns 0, 1 when a notebook is out of date or was kept unchanged, 2 on an error.
    """
    parser = argparse.ArgumentParser(prog="python -m mhalib.grade.release",
                                     description="Generate exercises/NN.ipynb from solutions/NN.ipynb.")
    parser.add_argument("solutions", nargs="*", help="solution notebooks (default: solutions/*.ipynb)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if an exercise differs from what would be generated")
    parser.add_argument("--out-dir", help="folder for the exercises (default: exercises/ next to solutions/)")
    parser.add_argument("--root", default=".", help="course root holding solutions/ (default: .)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite exercises even when someone changed them (their changes are lost)")
    args = parser.parse_args(argv)
    root = Path(args.root)
    sources = [Path(p) for p in args.solutions] or sorted((root / "solutions").glob("*.ipynb"))
    if not sources:
        print(f"no solution notebooks found under {root / 'solutions'}")
        return 0
    stale, kept = [], []
    for src in sources:
        try:
            text = render(src)
        except ReleaseError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        dest = exercise_path(src, args.out_dir)
        current = dest.read_text(encoding="utf-8") if dest.exists() else None
        if args.check and current != text:
            stale.append(dest)
            print(f"{dest}: {'missing' if current is None else 'differs from'} what {src} generates")
        elif not args.check and current != text and not args.force and not untouched(current, text, src):
            kept.append(dest)
            print(f"kept {dest}: it was changed since it was generated (a learner's work, or a hand edit), so it "
                  f"was not overwritten; copy your work elsewhere first, or pass --force to replace it",
                  file=sys.stderr)
        elif not args.check and current != text:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text, encoding="utf-8")
            print(f"wrote {dest}")
        elif not args.check:
            print(f"{dest} up to date")
    if args.check and not args.solutions:
        ex_dir = Path(args.out_dir) if args.out_dir else root / "exercises"
        names = {s.name for s in sources}
        for orphan in sorted(ex_dir.glob("*.ipynb")):
            if orphan.name not in names:
                stale.append(orphan)
                print(f"{orphan}: has no solution notebook in {root / 'solutions'}")
    if stale:
        print(f"{len(stale)} exercise notebook(s) out of date; run: python -m mhalib.grade.release")
        return 1
    if kept:
        print(f"{len(kept)} changed exercise notebook(s) left as they were: {', '.join(map(str, kept))}",
              file=sys.stderr)
        return 1
    if args.check:
        print(f"{len(sources)} exercise notebook(s) match their solutions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
