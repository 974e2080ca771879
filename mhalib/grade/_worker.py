"""The grader's child process: runs a submission's code and calls its graded functions.

Started by :mod:`mhalib.grade.sandbox` as ``python -I -c BOOT PACKAGE_PARENT LOG`` (the
same mhalib as the grader's, in isolated mode) in a fresh temporary working directory. It

1. takes the protocol pipes from stdin/stdout, points file descriptors 0, 1 and 2
   away from them (stdin to /dev/null, stdout and stderr to LOG), and caps what the
   learner's ``print`` can write;
2. applies its resource limits (memory, CPU time, file size) before any learner code;
3. answers the grader's requests: ``init`` (import torch when the exercise needs it),
   ``exec`` (run one notebook cell, statement by statement), ``call`` (run one case).

Nothing here is trusted by the grader: it only ever reads plain arrays back and
compares them with its own reference answers.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import signal
import sys
import traceback


class _CappedWriter:
    """A text stream that keeps at most ``cap`` characters and drops the rest."""

    def __init__(self, cap, name):
        self.cap, self.kept, self.dropped, self.name = cap, [], 0, name
        self.size = 0

    def write(self, s):
        s = str(s)
        room = self.cap - self.size
        if room > 0:
            self.kept.append(s[:room])
            self.size += min(len(s), room)
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

    def flush(self):
        pass

    def isatty(self):
        return False

    def fileno(self):
        raise OSError("no file descriptor while grading")

    @property
    def encoding(self):
        return "utf-8"

    def writable(self):
        return True

    def drain(self):
        text = "".join(self.kept)
        self.kept, self.size = [], 0
        dropped, self.dropped = self.dropped, 0
        return text, dropped


def _limit(resource, which, value):
    try:
        soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, hard if hard != resource.RLIM_INFINITY else value))
    except (ValueError, OSError):
        pass


def apply_limits(memory_mb, cpu_s, file_mb):
    import resource

    if memory_mb:
        _limit(resource, resource.RLIMIT_AS, int(memory_mb) << 20)
    if cpu_s:
        _limit(resource, resource.RLIMIT_CPU, int(cpu_s))
    if file_mb:
        _limit(resource, resource.RLIMIT_FSIZE, int(file_mb) << 20)
    _limit(resource, resource.RLIMIT_CORE, 0)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write fails instead of killing


# ----------------------------------------------------------------------------- cells
_CELL_MAGICS_TO_DROP = ("%%time", "%%timeit", "%%capture", "%%prun")
_DISPLAY_FUNCS = {"display", "print", "show", "plot", "imshow"}
_DISPLAY_MODULES = {"plt", "sns", "px", "IPython"}


def strip_magics(source):
    """IPython syntax -> plain Python: line magics and shell escapes become ``pass``."""
    lines = source.splitlines()
    if lines and lines[0].lstrip().startswith("%%"):
        if not lines[0].lstrip().startswith(_CELL_MAGICS_TO_DROP):
            return None  # %%bash, %%writefile, ...: not Python
        lines = lines[1:]
    out = []
    for line in lines:
        stripped = line.lstrip()
        if stripped.startswith(("%", "!")):
            out.append(line[: len(line) - len(stripped)] + "pass")
        elif re.match(r"^\s*[\w.]+\s*=\s*[%!]", line):
            out.append(line.split("=")[0] + "= None")
        else:
            out.append(line)
    return "\n".join(out)


def _only_displays(stmt):
    """True for a top-level statement that only shows something (skipped when grading)."""
    if not isinstance(stmt, ast.Expr):
        return False
    value = stmt.value
    if isinstance(value, (ast.Name, ast.Attribute, ast.Subscript, ast.Constant)):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        if isinstance(func, ast.Name) and func.id in _DISPLAY_FUNCS:
            return True
        if isinstance(func, ast.Attribute):
            base = func.value
            if isinstance(base, ast.Name) and base.id in _DISPLAY_MODULES:
                return True
            if func.attr in ("show", "savefig"):
                return True
    return False


def _where(tb, label_prefix="<cell"):
    frames = [f for f in traceback.extract_tb(tb) if f.filename.startswith(label_prefix)]
    if not frames:
        return ""
    f = frames[-1]
    return f"line {f.lineno} of {f.filename.strip('<>')}"


def _describe(exc):
    if isinstance(exc, SystemExit):
        return "SystemExit (sys.exit() or exit() was called)"
    if isinstance(exc, KeyboardInterrupt):
        return "was interrupted (KeyboardInterrupt)"
    text = str(exc)
    if len(text) > 500:
        text = text[:500] + " ..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_cell(ns, source, index):
    """Run a cell statement by statement; an error skips that statement only."""
    source = strip_magics(source)
    if source is None:
        return [], 0
    try:
        tree = ast.parse(source, filename=f"<cell {index}>")
    except SyntaxError as exc:
        return [f"cell {index}: SyntaxError: {exc.msg} (line {exc.lineno})"], 0
    errors, skipped = [], 0
    for stmt in tree.body:
        if _only_displays(stmt):
            skipped += 1
            continue
        module = ast.Module(body=[stmt], type_ignores=[])
        try:
            code = compile(module, f"<cell {index}>", "exec")
            exec(code, ns)  # noqa: S102 - this process exists to run the learner's code
        except BaseException as exc:  # noqa: BLE001 - SystemExit included
            where = _where(exc.__traceback__) or f"cell {index}"
            errors.append(f"{where}: {_describe(exc)}")
    return errors[:20], skipped


def _namespace():
    ns = {"__name__": "__main__", "__builtins__": builtins}
    ns["display"] = lambda *a, **k: None
    return ns


# ----------------------------------------------------------------------------- main loop
def serve(fd_in, fd_out, out_writer, err_writer):
    import numpy as np  # noqa: F401 - the lean start: numpy only

    from mhalib.grade import calling, protocol

    ns = _namespace()
    while True:
        try:
            header, arrays = protocol.recv(fd_in)
        except protocol.ChildDied:
            return
        op = header.get("op")
        reply, out_arrays = {"op": op}, []
        if op == "exit":
            return
        if op == "init":
            for name in header.get("preload", []):
                if name == "torch":
                    calling.capture_torch()
            reply["ok"] = True
        elif op == "exec":
            errors, skipped = run_cell(ns, header.get("source", ""), header.get("index", "?"))
            reply.update(ok=not errors, errors=errors, skipped=skipped)
        elif op == "call":
            try:
                args = [protocol.decode_value(t, arrays) for t in header.get("args", [])]
                kwargs = {k: protocol.decode_value(t, arrays) for k, t in header.get("kwargs", {}).items()}
                result, hits, tampered, after = calling.call(
                    header["adapter"], ns, header["name"], args, kwargs,
                    header.get("params", {}), header.get("forbidden", ()),
                )
                reply.update(status="ok", hits=hits, tampered=tampered)
                reply["result"] = protocol.encode_value(calling.to_plain(result), out_arrays)
                # the inputs as the call left them: the grader compares them with its originals
                reply["after"] = [[str(label), key, protocol.encode_value(value, out_arrays)]
                                  for label, key, value in after]
            except calling.GradingError as exc:
                reply.update(status="grading_error", message=str(exc))
            except NotImplementedError as exc:
                reply.update(status="not_implemented", message=str(exc)[:300])
            except BaseException as exc:  # noqa: BLE001
                reply.update(status="exception", message=_describe(exc),
                             where=_where(exc.__traceback__),
                             kinds=[c.__name__ for c in type(exc).__mro__][:12])
        else:
            reply["error"] = f"unknown op {op!r}"
        for writer, key in ((out_writer, "stdout"), (err_writer, "stderr")):
            _, dropped = writer.drain()
            reply[f"{key}_dropped"] = dropped
        protocol.send(fd_out, reply, out_arrays)


def main(argv):
    log_path = argv[1] if len(argv) > 1 else os.devnull
    memory_mb = int(os.environ.get("MHALIB_GRADE_MEMORY_MB", "0"))
    cpu_s = int(os.environ.get("MHALIB_GRADE_CPU_S", "0"))
    file_mb = int(os.environ.get("MHALIB_GRADE_FILE_MB", "0"))
    fd_in, fd_out = os.dup(0), os.dup(1)  # private copies, not inherited by subprocesses
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    cap = 1 << 16
    out_writer, err_writer = _CappedWriter(cap, "<stdout>"), _CappedWriter(cap, "<stderr>")
    sys.stdout, sys.stderr = out_writer, err_writer
    sys.stdin = open(os.devnull)  # noqa: SIM115
    sys.argv = ["submission"]
    apply_limits(memory_mb, cpu_s, file_mb)
    serve(fd_in, fd_out, out_writer, err_writer)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
