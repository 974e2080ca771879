"""The grader's child process: confinement, then a server that runs cells and calls.

The sandbox starts the source of :mod:`mhalib.grade.wire`, :mod:`mhalib.grade.adapters`
and this module, joined into one script (:data:`mhalib.grade.sandbox.WORKER_SOURCE`), as
``python -I -S -c SOURCE CONFIG``: standard library and NumPy (torch when needed), no
``mhalib``. Before any learner code it applies its limits, drops to the unprivileged user
of CONFIG, installs its system-call filter (or exits: nothing is graded) and makes
forbidden calls unusable (:func:`mhalib.grade.adapters.setup_forbidden`). Then it answers
``exec`` (one cell, run as Jupyter does) and ``call`` (one case, through
:func:`mhalib.grade.adapters.call`).

Imported by the grader, this module also gives the names of the other two (the grader
and the tests use ``worker.recv``, ``worker.call`` and the like).
"""

import builtins
import io
import json
import os
import sys
import traceback

if __name__ != "__main__":  # imported; in the child the other two modules' source comes first
    from mhalib.grade.adapters import (ADAPTERS, FRIENDLY_NAMES, Forbidding, ForbiddenCall,  # noqa: F401
                                       GradingError, _torch, call, patch_torch, setup_forbidden, to_plain)
    from mhalib.grade.wire import (MAX_DEPTH, MAX_FRAME, MAX_HEADER, Closed, ProtocolError, Timeout,  # noqa: F401
                                   Unsupported, decode_value, encode_value, recv, send)

DENIED_EXIT = 70  # the child could not drop its privileges: it ran nothing
ORPHAN_EXIT = 71  # the child's parent ended before it was ready: it ran nothing
FILTER_EXIT = 72  # the child could not install its system-call filter: it ran nothing


# ----------------------------------------------------------------------------- cells
class NoShell:
    """What ``get_ipython()`` gives graded code. The grader turns IPython's syntax into calls
    of it (:func:`mhalib.grade.grader.to_python`): ``%time``, ``%timeit`` and ``%prun`` run
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
    """Run one cell (plain Python: the grader has converted IPython's syntax) as Jupyter
    does; returns the error that ended it (or ``None``)."""
    try:
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


def serve(fd_in, fd_out, config):
    """Answer the grader's ``exec`` and ``call`` requests until ``exit`` or a message that cannot be read."""
    owner = os.getpid()  # a process forked by learner code that returns here ends instead of answering
    ns = {"__name__": "__main__", "__builtins__": builtins, "display": lambda *a, **k: None}
    shell = NoShell(ns)
    ns["get_ipython"] = lambda: shell
    send(fd_out, {"op": "ready", "uid": os.getuid(), "euid": os.geteuid(), "filtered": bool(config.get("seccomp")),
                  "sees": [p for p in config.get("hidden", []) if os.access(p, os.R_OK)]})
    while True:
        try:
            header, arrays = recv(fd_in, max_header=MAX_FRAME)
        except ProtocolError:
            return
        op, reply, out_arrays = header.get("op"), {}, []
        before = _Counter.count
        if op == "exit":
            return
        if op == "exec":
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
        reply["printed"] = _Counter.count - before
        if os.getpid() != owner:
            os._exit(0)
        send(fd_out, reply, out_arrays)


def main(argv):
    """The child's entry point: confine itself, set up the forbidden calls, then serve the grader.

    ``argv[1]`` is the JSON config; stdin and stdout carry the messages, printed output is only counted.
    """
    parent = os.getppid()
    config = json.loads(argv[1])
    fd_in, fd_out = os.dup(0), os.dup(1)  # private copies; 0, 1 and 2 go nowhere
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    _confine(config, parent)
    setup_forbidden(config.get("forbidden", []))
    if "torch" in config.get("preload", []):
        _torch()
    sys.stdout = sys.stderr = _Counter()
    sys.stdin = open(os.devnull)  # noqa: SIM115
    sys.argv = ["submission"]
    serve(fd_in, fd_out, config)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
