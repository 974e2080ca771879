"""Run a submission's code in a separate, resource-limited Python process.

The grader's process never executes learner code. :class:`Sandbox` starts
``python -I -m mhalib.grade._worker`` in its own temporary working directory with a
minimal environment and limits on memory (``RLIMIT_AS``), CPU time, file size and
printed output, runs the notebook's cells there, and asks it to call graded
functions one case at a time, each under a wall-clock time limit. When the child
dies, hangs or misbehaves it is killed and, if asked, started again (re-running the
cells that worked), so one bad function cannot take the others down with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from mhalib.grade import protocol

__all__ = ["Limits", "Sandbox", "CallOutcome"]


@dataclass
class Limits:
    """Resource limits for the child process (all per submission)."""

    memory_mb: int = 2048  # address space (RLIMIT_AS); torch needs about 1 GiB
    cpu_s: int = 300  # CPU seconds for the whole child (RLIMIT_CPU)
    file_mb: int = 64  # largest file the child may write (RLIMIT_FSIZE)
    call_timeout_s: float = 10.0  # wall clock per graded call
    cell_timeout_s: float = 60.0  # wall clock per notebook cell
    start_timeout_s: float = 60.0  # wall clock to start the child
    drop_privileges: bool = True  # when the grader runs as root, run the child as nobody
    notebook_budget_s: float = 300.0  # wall clock for running the notebook, restarts included


@dataclass
class CallOutcome:
    """What one call came back as.

    ``status``: ok, not_implemented, grading_error, exception, timeout, died, bad_reply.
    """

    status: str
    result: object = None
    message: str = ""
    where: str = ""
    hits: list = field(default_factory=list)
    tampered: bool = False
    output_dropped: int = 0
    after: list = field(default_factory=list)  # [(label, key, array)]: inputs after the call
    kinds: list = field(default_factory=list)  # an exception's class name and its bases' names


NOBODY = 65534
# The child runs in isolated mode (-I: no user site, no PYTHON* variables, no current
# directory on sys.path) and imports the same mhalib as the grader, from where it lives.
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); del sys.argv[1]; "
         "from mhalib.grade._worker import main; main(sys.argv)")
_DROP_WORKS = None  # learnt once per grader process: can the child run as nobody here?


class Sandbox:
    """One child process running one submission's cells.

    Args:
        cells: list of ``(index, source)`` code cells to run, in order.
        preload: modules the child imports before the learner's code (``["torch"]``).
        limits: :class:`Limits`.
    """

    def __init__(self, cells, *, preload=(), limits=None):
        self.cells = list(cells)
        self.preload = list(preload)
        self.limits = limits or Limits()
        self.proc = None
        self.tmp = None
        self.skip = set()  # cells that hung or killed the process: never run again
        self.cell_errors = {}  # index -> [messages]
        self.notes = []
        self.restarts = 0
        self.dropped_privileges = False
        self._budget_end = None

    # -- life cycle -------------------------------------------------------------
    def _env(self, home):
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": home,
            "TMPDIR": home,
            "LANG": "C.UTF-8",
            "MPLBACKEND": "Agg",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            "TQDM_DISABLE": "1",
            "MHALIB_GRADE_MEMORY_MB": str(self.limits.memory_mb),
            "MHALIB_GRADE_CPU_S": str(self.limits.cpu_s),
            "MHALIB_GRADE_FILE_MB": str(self.limits.file_mb),
        }
        return env

    def _spawn(self, drop):
        self.tmp = tempfile.mkdtemp(prefix="mhalib-grade-")
        work = os.path.join(self.tmp, "work")
        os.mkdir(work)
        log = os.path.join(work, ".output.log")
        extra = {}
        if drop:
            for path in (self.tmp, work):
                os.chown(path, NOBODY, NOBODY)
            extra = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _BOOT, _PACKAGE_PARENT, log],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=work,
            env=self._env(work),
            start_new_session=True,  # its own process group: killed as a whole
            close_fds=True,
            **extra,
        )
        return self._request({"op": "init", "preload": self.preload}, (), self.limits.start_timeout_s)

    def start(self):
        """Start the child and run the cells; returns self."""
        global _DROP_WORKS
        self.close()
        drop = (self.limits.drop_privileges and hasattr(os, "geteuid") and os.geteuid() == 0
                and _DROP_WORKS is not False)
        try:
            reply = self._spawn(drop)
        except OSError:
            reply = "died"
        if drop and not isinstance(reply, tuple):
            # the interpreter or the course is not readable by nobody here: run as this user
            _DROP_WORKS = False
            self.close()
            drop = False
            reply = self._spawn(False)
        elif drop:
            _DROP_WORKS = True
        self.dropped_privileges = drop
        if not isinstance(reply, tuple):
            self.notes.append(f"the grading process could not start ({self._last_failure})")
            return self
        if self._budget_end is None:
            self._budget_end = time.monotonic() + self.limits.notebook_budget_s
        for index, source in self.cells:
            if index in self.skip:
                continue
            if time.monotonic() > self._budget_end:
                self.skip.add(index)
                self.notes.append(f"cell {index} was not run: the notebook used up its "
                                  f"{self.limits.notebook_budget_s:g} s")
                continue
            reply = self._request({"op": "exec", "source": source, "index": index}, (),
                                  self.limits.cell_timeout_s)
            if isinstance(reply, tuple):
                header, _ = reply
                if header.get("errors"):
                    self.cell_errors[index] = header["errors"]
                continue
            # the cell hung or killed the process: skip it from now on, restart, go on
            self.skip.add(index)
            self.notes.append(f"cell {index} {self._last_failure}; it was skipped")
            return self.start()
        return self

    @property
    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.proc = None

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                protocol.send(self.proc.stdin.fileno(), {"op": "exit"})
            except OSError:
                pass
        self.kill()
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
        return False

    # -- requests ---------------------------------------------------------------
    _last_failure = ""

    def _request(self, header, arrays, timeout):
        """Send one request; returns ``(header, arrays)`` or a failure string (and kills)."""
        if not self.alive:
            self._last_failure = "could not run: the grading process had stopped"
            return "died"
        try:
            protocol.send(self.proc.stdin.fileno(), header, arrays)
            return protocol.recv(self.proc.stdout.fileno(), timeout)
        except protocol.ChildTimeout:
            self._last_failure = f"did not finish within {timeout:g} s"
            self.kill()
            return "timeout"
        except (protocol.ChildDied, BrokenPipeError):
            code = self.proc.wait(timeout=10) if self.proc else None
            self._last_failure = self._death_message(code)
            self.kill()
            return "died"
        except (protocol.ProtocolError, OSError) as exc:
            self._last_failure = f"sent back something the grader cannot read ({exc})"
            self.kill()
            return "bad_reply"

    def _death_message(self, code):
        if code is None:
            return "stopped the process"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            if name == "SIGXCPU":
                return f"used up the CPU time limit ({self.limits.cpu_s} s)"
            if name == "SIGKILL":
                return "was killed (out of memory or a limit)"
            return f"crashed the process ({name})"
        return f"ended the process (exit code {code}, e.g. os._exit)"

    def call(self, adapter, name, args, kwargs, params, forbidden, encode):
        """Run one case in the child; returns a :class:`CallOutcome`.

        ``encode`` turns the plain arguments into protocol trees and arrays.
        """
        if not self.alive:
            self.restarts += 1
            self.start()
        arrays = []
        header = {
            "op": "call", "adapter": adapter, "name": name,
            "args": [encode(a, arrays) for a in args],
            "kwargs": {k: encode(v, arrays) for k, v in kwargs.items()},
            "params": params, "forbidden": list(forbidden),
        }
        reply = self._request(header, arrays, self.limits.call_timeout_s)
        if not isinstance(reply, tuple):
            return CallOutcome(status=reply, message=f"{name} {self._last_failure}")
        head, out_arrays = reply
        status = head.get("status")
        dropped = int(head.get("stdout_dropped", 0) or 0) + int(head.get("stderr_dropped", 0) or 0)
        if status == "ok":
            try:
                result = protocol.decode_value(head.get("result"), out_arrays)
            except protocol.ProtocolError as exc:
                self.kill()
                return CallOutcome(status="bad_reply", message=f"{name} returned something unreadable ({exc})")
            hits = [str(h)[:200] for h in head.get("hits", [])][:10] if isinstance(head.get("hits"), list) else []
            after = []
            try:
                for label, key, tree in head.get("after", [])[:16]:
                    if isinstance(key, (int, str)) and not isinstance(key, bool):
                        after.append((str(label)[:100], key, protocol.decode_value(tree, out_arrays)))
            except (TypeError, ValueError, protocol.ProtocolError):
                after = [("an input", 0, None)]  # unreadable: counts as changed
            return CallOutcome(status="ok", result=result, hits=hits, tampered=bool(head.get("tampered")),
                               output_dropped=dropped, after=after)
        if status in ("grading_error", "not_implemented", "exception"):
            kinds = head.get("kinds") if isinstance(head.get("kinds"), list) else []
            return CallOutcome(status=status, message=str(head.get("message", ""))[:1000],
                               where=str(head.get("where", ""))[:200], output_dropped=dropped,
                               kinds=[str(k)[:100] for k in kinds[:12]])
        self.kill()
        return CallOutcome(status="bad_reply", message=f"{name}: the grading process sent an unexpected reply")
