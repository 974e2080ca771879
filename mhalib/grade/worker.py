"""The grader's child process: confinement, then a server that reads the notebook, runs
cells and calls.

The sandbox starts the source of :mod:`mhalib.grade.wire`, :mod:`mhalib.grade.adapters`
and this module, joined into one script (:data:`mhalib.grade.sandbox.WORKER_SOURCE`), as
``python -I -S -c SOURCE CONFIG``: standard library and NumPy (torch when needed), no
``mhalib``. First it applies its limits, drops to the unprivileged user of CONFIG and
installs its system-call filter (or exits: nothing is graded). Then it answers ``read``
(the notebook parsed, converted and compiled here, never in the grader), ``setup``
(forbidden calls made unusable, :func:`mhalib.grade.adapters.setup_forbidden`, and torch
imported; before it no learner code runs), ``exec`` (one cell, run as Jupyter does) and
``call`` (one case, through :func:`mhalib.grade.adapters.call`).

Imported by the grader, this module also gives the names of the other two (the grader
and the tests use ``worker.recv``, ``worker.call`` and the like).
"""

import builtins
import io
import json
import os
import re
import signal
import sys
import threading
import time
import traceback

import numpy as np

if __name__ != "__main__":  # imported; in the child the other two modules' source comes first
    from mhalib.grade.adapters import (ADAPTERS, FRIENDLY_NAMES, Forbidding, ForbiddenCall,  # noqa: F401
                                       GradingError, _torch, call, patch_torch, setup_forbidden, to_plain)
    from mhalib.grade.wire import (MAX_DEPTH, MAX_FRAME, MAX_HEADER, Closed, ProtocolError, Timeout,  # noqa: F401
                                   Unsupported, decode_value, encode_value, recv, send)

DENIED_EXIT = 70  # the child could not drop its privileges: it ran nothing
ORPHAN_EXIT = 71  # the child's parent ended before it was ready: it ran nothing
FILTER_EXIT = 72  # the child could not install its system-call filter: it ran nothing


# ----------------------------------------------------------------------------- the notebook
# Caps on what the child reads of a submission (docs/instructors.md states them).
MAX_CELL_CHARS = 2 << 20  # a code cell longer than this is not run (nor compiled, nor converted)
MAX_CODE_CELLS = 500  # code cells to run after the 500th are not run
SKIP_TAGS = {"self-check", "grader-skip"}
KEEP_CELL_MAGICS = ("time", "timeit", "capture", "prun")  # cell magics whose body is Python: it runs
# IPython's transformer re-reads a cell once per line it rewrites (a magic, a shell command,
# help): a cell longer than IPYTHON_MAX_CHARS or with more than IPYTHON_MAX_LINES such lines is
# converted line by line instead, and so is every cell once the notebook's IPYTHON_SECONDS of
# conversion are spent (an interval timer stops IPython mid-cell).
IPYTHON_MAX_CHARS, IPYTHON_MAX_LINES, IPYTHON_SECONDS = 32_768, 20, 3.0
IPYTHON_MAX_MAGICS = IPYTHON_MAX_LINES  # the name of earlier versions
# IPython syntax somewhere (a magic, a shell command, help), or a cell indented as a whole,
# which IPython dedents; any other cell is plain Python already and is left as it is.
_MAYBE_IPYTHON = re.compile(r"^[ \t]*[%!?]|\?[ \t]*$|=[ \t]*[%!]|\A[ \t]", re.M)
_IPYTHON_LINE = re.compile(r"^[ \t]*[%!?]|\?[ \t]*$|=[ \t]*[%!]", re.M)  # a line IPython rewrites
_HELP_LINE = re.compile(r"^([ \t]*)(?:\?\??[\w.]+|[\w.]+\?\??)[ \t]*$")
_BLANK_LINES = re.compile(r"^(?:[ \t\f\v]*\n)*")


class NotebookError(Exception):
    """The submission could not be read as a notebook; the message says why."""


class _OutOfTime(BaseException):
    """The notebook's seconds of IPython conversion are spent (raised by an interval timer)."""


def clean(text, limit=300):
    """``text`` as one printable line of at most ``limit`` characters (the rest cut, marked)."""
    text = str(text)
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text[: limit * 2])
    return text if len(text) <= limit else text[: limit - 5] + " ..."


def parse_notebook(data):
    """The notebook in ``data`` (its bytes) as a dict with a list of ``cells`` in version 4's
    form (a version 1 to 3 notebook's worksheets and ``input`` read as version 4 has them);
    :class:`NotebookError` says why it is not one. Nothing is validated beyond that: a
    notebook is graded as it is."""
    try:
        text = bytes(data).decode("utf-8")
        nb = json.loads(text)
    except UnicodeDecodeError:
        raise NotebookError("the file is not a notebook (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise NotebookError(f"the file is not a valid notebook (bad JSON: {clean(exc, 100)}; was it truncated?)") \
            from None
    except (ValueError, RecursionError, MemoryError) as exc:  # nested too deeply, too large
        raise NotebookError(f"the file is not a valid notebook ({type(exc).__name__}: {clean(exc, 150)})") from None
    if not isinstance(nb, dict) or not any(isinstance(nb.get(k), list) for k in ("cells", "worksheets")):
        raise NotebookError("the file is JSON but not a Jupyter notebook (no list of cells)")
    major = nb.get("nbformat", 1)
    if type(major) is not int or not 1 <= major <= 4:
        raise NotebookError(f"the file is not a valid notebook (NBFormatError: Unsupported nbformat version "
                            f"{clean(major, 40)})")
    if major == 4:
        return nb
    cells = []  # versions 2 and 3: worksheets; version 1: cells; code in "input" (1: "code")
    sheets = nb.get("worksheets") if major > 1 else [nb]
    for sheet in sheets if isinstance(sheets, list) else []:
        for cell in (sheet.get("cells") if isinstance(sheet, dict) else None) or []:
            if isinstance(cell, dict) and cell.get("cell_type") == "code":
                cell = dict(cell, source=cell.get("input", cell.get("code", "")))
            cells.append(cell)
    return dict(nb, cells=cells)


def code_cells(nb):
    """``[(index, source)]`` of the code cells the grader runs (self-checks skipped); ``index``
    is the cell's position among all the notebook's cells (see :func:`code_cell_labels`)."""
    out = []
    for index, cell in enumerate(c if isinstance(c, dict) else {} for c in nb.get("cells") or []):
        meta, source = cell.get("metadata"), cell.get("source", "")
        tags = meta.get("tags") if isinstance(meta, dict) else None
        source = "".join(s for s in source if isinstance(s, str)) if isinstance(source, list) else source
        if (cell.get("cell_type") == "code" and isinstance(source, str) and source.strip()
                and not (isinstance(tags, list) and SKIP_TAGS & {t for t in tags if isinstance(t, str)})):
            out.append((index, source))
    return out


def code_cell_labels(nb, only=None):
    """``{index: label}``: each code cell named as a learner finds it in JupyterLab, which
    numbers no cell: ``"code cell N (the one starting `first line`)"``, N counted from 1 over
    the notebook's code cells in order (markdown and raw cells are not counted; self-checks
    and empty cells are); ``index`` is its position among all cells, as in :func:`code_cells`.
    ``only``: the indexes to label (all code cells by default)."""
    labels, number = {}, 0
    for index, cell in enumerate(c if isinstance(c, dict) else {} for c in nb.get("cells") or []):
        if cell.get("cell_type") != "code":
            continue
        number += 1
        if only is not None and index not in only:
            continue
        source = cell.get("source", "")
        source = "".join(s for s in source if isinstance(s, str)) if isinstance(source, list) else source
        first = next((line.strip() for line in str(source or "")[:4096].splitlines() if line.strip()), "")
        first = clean(first, 40).replace("`", "'")
        labels[index] = f"code cell {number} " + (f"(the one starting `{first}`)" if first else "(an empty one)")
    return labels


def _stop_converting(*args):
    raise _OutOfTime


def _ipython(source, deadline):
    """IPython's own conversion of ``source``, stopped by an interval timer at ``deadline``
    (where one can be set: the main thread of a process with ``SIGALRM``)."""
    from IPython.core.inputtransformer2 import TransformerManager

    timer = (deadline is not None and hasattr(signal, "setitimer")
             and threading.current_thread() is threading.main_thread())
    if deadline is not None and time.monotonic() >= deadline:
        raise _OutOfTime
    if timer:
        previous = signal.signal(signal.SIGALRM, _stop_converting)
        signal.setitimer(signal.ITIMER_REAL, max(deadline - time.monotonic(), 1e-3))
    try:
        return TransformerManager().transform_cell(source)
    finally:
        if timer:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def to_python(source, deadline=None):
    """A cell in IPython's syntax as plain Python, line for line; ``None`` for a cell that is
    not Python (``%%bash``, ``%%writefile`` and other cell magics), which grading skips.

    IPython's own ``TransformerManager`` converts line magics, shell commands and help
    (``%matplotlib inline``, ``!pip install``, ``x = !ls``, ``f?``) into calls of
    ``get_ipython()``, which in the child do nothing (:class:`NoShell`); it reads Python's
    tokens, so a line that starts with ``%`` inside a string or a bracket is left alone. The
    body of ``%%time``, ``%%timeit``, ``%%capture`` and ``%%prun`` runs as the cell, its lines
    numbered as in the notebook. Without IPython installed, for a cell of more than
    ``IPYTHON_MAX_CHARS`` characters or ``IPYTHON_MAX_LINES`` lines that IPython rewrites, and
    once ``time.monotonic()`` passes ``deadline``, a line-by-line approximation does the same
    for the common cases (IPython is stopped at ``deadline`` in the middle of a cell).
    """
    source = source.replace("\r\n", "\n").replace("\r", "\n")
    skipped = _BLANK_LINES.match(source).group()  # blank lines first: kept, so the numbering holds
    first, _, rest = source[len(skipped):].partition("\n")
    if first.lstrip().startswith("%%"):
        name = first.lstrip()[2:].split(maxsplit=1)
        if not name or name[0] not in KEEP_CELL_MAGICS:
            return None
        source = f"{skipped}# {first.strip()}\n{rest}"  # a comment now: the body keeps its line numbers
    if not _MAYBE_IPYTHON.search(source):
        return source
    if (len(source) > IPYTHON_MAX_CHARS or (deadline is not None and time.monotonic() > deadline)
            or sum(1 for _ in zip(range(IPYTHON_MAX_LINES + 1), _IPYTHON_LINE.finditer(source)))
            > IPYTHON_MAX_LINES):
        return _approximate_python(source)
    try:
        python = _ipython(source, deadline).rstrip("\n")
    except ImportError:
        return _approximate_python(source)
    except _OutOfTime:
        return _approximate_python(source)
    except Exception:  # noqa: BLE001 - what IPython cannot read, Python will report as a syntax error
        return source
    lost = skipped.count("\n") - (len(python) - len(python.lstrip("\n")))  # IPython drops leading blank lines
    return "\n" * max(lost, 0) + python  # put back: every line keeps its number


def _approximate_python(source):
    """Magics, shell commands and help as ``pass`` (``x = !ls`` as ``x = None``), line by line."""
    return "\n".join(_HELP_LINE.sub(r"\1pass", re.sub(r"^(\s*)[%!].*", r"\1pass",
                                                      re.sub(r"^(\s*[\w.]+\s*=)\s*[%!].*", r"\1 None", line)))
                     for line in source.split("\n"))


def syntax_errors(cells, keep=None):
    """``[(index, line, message)]`` of the cells Python cannot parse, found without running
    anything (only compiled); ``cells`` are plain Python (:func:`to_python`). ``keep``: a dict
    that receives ``{index: (source, code)}`` of the cells that compile, for :func:`run_cell`."""
    found = []
    for index, source in cells:
        try:
            code = compile(source, f"<cell {index}>", "exec", dont_inherit=True)
        except SyntaxError as exc:  # IndentationError and TabError included
            found.append((index, exc.lineno, f"{type(exc).__name__}: {clean(exc.msg, 150)}"))
        except (ValueError, RecursionError, MemoryError, OverflowError) as exc:  # e.g. a NUL byte, deep nesting
            found.append((index, None, f"{type(exc).__name__}: {clean(exc, 150)}"))
        else:
            if keep is not None:
                keep[index] = (source, code)
    return found


_COMPILED = {}  # {index: (source, code)}: the cells compiled by read_notebook, for run_cell


def read_notebook(data, seconds=IPYTHON_SECONDS):
    """The ``read`` request's reply ``(header, arrays)`` for the notebook ``data`` (bytes):
    ``problem`` (not a notebook), or ``exercise`` (its metadata's), ``labels`` (``{index:
    label}``), ``cells`` (``[[index, size]]``: the cells to run as plain Python, their UTF-8
    one after another in the one array), ``syntax`` (``[[index, line, message]]``) and
    ``notes`` (cells not run for a cap). ``seconds``: IPython's time for the notebook."""
    try:
        nb = parse_notebook(data)
    except NotebookError as exc:
        return {"problem": str(exc)}, []
    del data
    meta = nb.get("metadata")
    mh = meta.get("mhalib") if isinstance(meta, dict) else None
    key = mh.get("exercise") if isinstance(mh, dict) else None
    cells, notes = code_cells(nb), []
    if len(cells) > MAX_CODE_CELLS:
        notes.append(f"the notebook has {len(cells)} code cells to run; only the first {MAX_CODE_CELLS} were run "
                     f"(at most {MAX_CODE_CELLS} are)")
        cells = cells[:MAX_CODE_CELLS]
    labels = code_cell_labels(nb, {index for index, _ in cells})
    del nb
    kept = []
    for index, source in cells:
        if len(source) > MAX_CELL_CHARS:
            notes.append(f"cell {index} was not run: it holds {len(source) / (1 << 20):.1f} MiB of code; cells over "
                         f"{MAX_CELL_CHARS >> 20} MiB are not run")
        else:
            kept.append((index, source))
    deadline = time.monotonic() + seconds
    python = [(index, to_python(source, deadline)) for index, source in kept]
    python = [(index, text) for index, text in python if text is not None]
    _COMPILED.clear()
    broken = syntax_errors(python, keep=_COMPILED)
    encoded = [text.encode("utf-8", "surrogatepass") for _, text in python]
    return ({"exercise": clean(key, 200) if isinstance(key, str) else None,
             "labels": {str(index): label for index, label in labels.items()},
             "cells": [[index, len(text)] for (index, _), text in zip(python, encoded)],
             "syntax": [list(b) for b in broken], "notes": notes},
            [np.frombuffer(b"".join(encoded), dtype=np.uint8)])


# ----------------------------------------------------------------------------- cells
class NoShell:
    """What ``get_ipython()`` gives graded code. The grader turns IPython's syntax into calls
    of it (:func:`to_python`): ``%time``, ``%timeit`` and ``%prun`` run
    their statement once, in the notebook's namespace ``ns``; every other magic and shell
    command does nothing and returns ``None``."""

    # The magics whose statement runs, and their options that take a value (the others are flags).
    RUN = {"time": (), "timeit": ("-n", "-r", "-p"), "prun": ("-s", "-l", "-T", "-D", "-m")}

    def __init__(self, ns):
        self.ns = ns

    def run_line_magic(self, name, line, *args, **kwargs):
        """``%name line``: the statement of ``%time``, ``%timeit`` and ``%prun`` (after their
        options), once, in the notebook's namespace; any other magic, or a statement that is
        not Python, does nothing."""
        if name not in self.RUN or not isinstance(line, str):
            return None
        statement = line.strip()
        while statement.startswith("-"):  # the options, and the value of those that take one
            option, _, statement = statement.partition(" ")
            if option in self.RUN[name]:
                statement = statement.lstrip().partition(" ")[2]
            statement = statement.lstrip()
        try:
            code = compile(statement, f"<%{name}>", "exec")
        except SyntaxError:
            return None
        exec(code, self.ns)  # noqa: S102 - the learner's own statement
        return None

    def run_cell_magic(self, *args, **kwargs):
        """``%%magic`` of a cell whose body is not Python: nothing."""
        return None

    def system(self, *args, **kwargs):
        """``!command``: nothing."""
        return None

    def getoutput(self, *args, **kwargs):
        """``x = !command``: ``None``."""
        return None


def describe(exc):
    """``"Type: message"`` for an exception, the message cut to 400 characters; ``SystemExit`` explained."""
    if isinstance(exc, SystemExit):
        return "SystemExit (sys.exit() or exit() was called)"
    try:
        text = str(exc)[:400]
    except BaseException:  # noqa: BLE001 - a message that cannot be read
        text = "(a message that could not be read)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def where(tb):
    """``"line L of cell N"`` for the innermost frame of a traceback in a cell, or ``""``."""
    frames = [f for f in traceback.extract_tb(tb) if f.filename.startswith("<cell")]
    return f"line {frames[-1].lineno} of {frames[-1].filename.strip('<>')}" if frames else ""


def run_cell(ns, source, index):
    """Run one cell (plain Python: converted from IPython's syntax by :func:`read_notebook`)
    as Jupyter does; returns the error that ended it (or ``None``)."""
    source_and_code = _COMPILED.pop(index, None)
    try:
        if source_and_code is not None and source_and_code[0] == source:  # compiled when read
            code = source_and_code[1]
        else:
            code = compile(source, f"<cell {index}>", "exec")
    except SyntaxError as exc:
        return f"cell {index}, line {exc.lineno}: {type(exc).__name__}: {exc.msg}"
    except BaseException as exc:  # noqa: BLE001 - e.g. a NUL byte in the source
        return f"cell {index}: {describe(exc)}"
    try:
        exec(code, ns)  # noqa: S102 - this process exists to run the learner's code
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt included
        return f"{where(exc.__traceback__) or f'cell {index}'}: {describe(exc)}"
    return None


# ----------------------------------------------------------------------------- the child
class _Counter(io.TextIOBase):
    """``sys.stdout`` and ``sys.stderr`` of the child: counts what is printed, keeps nothing."""

    count = 0

    def write(self, s):
        """Count the characters of ``s`` and drop them; returns their number."""
        _Counter.count += len(str(s))
        return len(str(s))


def _confine(config, parent):
    """Limits, then the unprivileged user, then death with ``parent`` (the pid that started
    it); exits without running anything if that fails."""
    import ctypes
    import resource
    import signal

    limits = config.get("limits", {})
    for which, value in ((resource.RLIMIT_AS, limits.get("memory_mb", 0) << 20), (resource.RLIMIT_CORE, -1),
                         (resource.RLIMIT_CPU, limits.get("cpu_s", 0)), (resource.RLIMIT_NPROC, limits.get("nproc", 0)),
                         (resource.RLIMIT_FSIZE, limits.get("file_mb", 0) << 20)):
        try:
            hard = resource.getrlimit(which)[1]
            value = max(value, 0) if hard == resource.RLIM_INFINITY else min(max(value, 0), hard)
            if value or which == resource.RLIMIT_CORE:
                resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            pass
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
    uid, gid = config.get("uid"), config.get("gid")
    try:
        if uid is not None and os.getuid() != uid:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        if sys.platform.startswith("linux"):  # elsewhere (a learner's own Mac) there is no prctl
            libc = ctypes.CDLL(None)
            libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
            # PR_SET_PDEATHSIG: killed when its parent ends (the grader, or bubblewrap, which
            # ends with the grader; as root bubblewrap cannot signal another uid, and the
            # grader's guard does it). Set here, after the change of user, which clears it; a
            # parent already gone (another parent now) means no grader to answer.
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(ORPHAN_EXIT)
        if uid is not None and (os.getresuid() != (uid,) * 3 or os.getresgid() != (gid,) * 3 or _regains_root()):
            raise PermissionError("the user did not change for good")
    except (OSError, ValueError, AttributeError):
        os._exit(DENIED_EXIT)
    if config.get("seccomp"):
        try:
            _install_filter(bytes.fromhex(config["seccomp"]))
        except (OSError, ValueError, AttributeError):
            os._exit(FILTER_EXIT)


def _install_filter(program):
    """Install the seccomp program ``program`` (``struct sock_filter`` bytes, built by
    ``mhalib.grade.seccomp``) on this process and everything it starts from now on."""
    import ctypes

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS, which a filter requires of an unprivileged process
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def _regains_root():
    try:
        os.setuid(0)
    except PermissionError:
        return False
    return True


def _setup(header):
    """The ``setup`` request: forbidden calls made unusable, then the modules the exercise
    preloads (``torch``); before it no learner code may run."""
    setup_forbidden(header.get("forbidden", []))
    if "torch" in header.get("preload", []):
        _torch()


def serve(fd_in, fd_out, config):
    """Answer the grader's requests until ``exit`` or a message that cannot be read: ``read``
    (first, if at all), ``setup`` (once, before any ``exec`` or ``call``), ``exec``, ``call``."""
    owner = os.getpid()  # a process forked by learner code that returns here ends instead of answering
    ns = {"__name__": "__main__", "__builtins__": builtins, "display": lambda *a, **k: None}
    shell = NoShell(ns)
    ns["get_ipython"] = lambda: shell
    send(fd_out, {"op": "ready", "uid": os.getuid(), "euid": os.geteuid(), "filtered": bool(config.get("seccomp")),
                  "sees": [p for p in config.get("hidden", []) if os.access(p, os.R_OK)]})
    first, ready = True, False
    while True:
        try:
            header, arrays = recv(fd_in, max_header=MAX_FRAME)
        except ProtocolError:
            return
        op, reply, out_arrays = header.get("op"), {}, []
        before = _Counter.count
        if op == "exit":
            return
        if op == "read" and first and len(arrays) == 1:  # nothing of the learner's has run yet
            try:
                reply, out_arrays = read_notebook(arrays[0].tobytes(), float(header.get("seconds", IPYTHON_SECONDS)))
            except BaseException as exc:  # noqa: BLE001 - e.g. MemoryError: the grader reports it
                reply, out_arrays = {"problem": f"the notebook could not be read ({describe(exc)[:200]})"}, []
            del arrays
        elif op == "setup" and not ready:
            try:
                _setup(header)
                ready = True
            except BaseException as exc:  # noqa: BLE001 - e.g. torch that cannot be imported
                reply["error"] = describe(exc)
        elif op in ("exec", "call") and not ready:
            reply.update(error="the child was not set up", status="grading_error",
                         message="the grading process was not set up; tell your instructor")
        elif op == "exec":
            reply["error"] = run_cell(ns, str(header.get("source", "")), header.get("index", "?"))
        elif op == "call":
            guard = Forbidding(header.get("forbidden", ()))
            try:
                args = [decode_value(t, arrays) for t in header.get("args", [])]
                kwargs = {k: decode_value(t, arrays) for k, t in header.get("kwargs", {}).items()}
                result, after = call(header["adapter"], ns, header["name"], args, kwargs,
                                     header.get("params", {}), guard)
                reply["result"] = encode_value(to_plain(result), out_arrays)
                reply["after"] = [[label, key, encode_value(value, out_arrays)] for label, key, value in after]
                reply["status"] = "ok"
            except GradingError as exc:
                reply.update(status="grading_error", message=str(exc))
            except NotImplementedError as exc:
                reply.update(status="not_implemented", message=str(exc)[:300])
            except BaseException as exc:  # noqa: BLE001
                reply.update(status="exception", message=describe(exc), where=where(exc.__traceback__),
                             kinds=[c.__name__ for c in type(exc).__mro__][:12])
            if guard.hits:
                reply.update(status="forbidden", hits=guard.hits)
        else:
            reply["error"] = f"a request the child does not take here ({str(op)[:30]})"
        first = False
        reply["printed"] = _Counter.count - before
        if os.getpid() != owner:
            os._exit(0)
        send(fd_out, reply, out_arrays)


def main(argv):
    """The child's entry point: confine itself, then serve the grader.

    ``argv[1]`` is the JSON config; stdin and stdout carry the messages, printed output is only counted.
    """
    parent = os.getppid()
    config = json.loads(argv[1])
    fd_in, fd_out = os.dup(0), os.dup(1)  # private copies; 0, 1 and 2 go nowhere
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    _confine(config, parent)
    sys.stdout = sys.stderr = _Counter()
    sys.stdin = open(os.devnull)  # noqa: SIM115
    sys.argv = ["submission"]
    serve(fd_in, fd_out, config)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
