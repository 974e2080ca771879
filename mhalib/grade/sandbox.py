"""Where a submission's code runs: a child process, isolated as :func:`decide` says.

:func:`decide` picks the isolation once, before the first submission, by starting a
child the real way and checking what it reports before any learner code (its user, and
that it cannot read the course); it never changes during a run:

* **bubblewrap**: own PID, network, IPC and UTS namespaces; ``/usr``, the Python and the
  site-packages (at ``/site/N``) read-only, nothing else of the machine (no checkout, no
  ``mhalib``, no results, no other submission); a private ``/tmp`` of ``Limits.file_mb``;
  an unprivileged user (as root, an unused uid per job, ``UID_BASE`` and up; otherwise
  uid 65534 in a user namespace). Its PID namespace, and all it started, end with it.
* **unprivileged user**: as root where bubblewrap cannot run, in a one-submission
  container only (``mhalib.grade.gradescope``): user ``nobody``, a private folder, every
  process of ``nobody`` killed afterwards; the course must be unreadable to ``nobody``.
* **none**: only when asked (``--no-isolation``), for a learner's own work.

Otherwise nothing is graded (fail closed). In every mode a keeper of the grader's starts
the child and ends it with all it started (:data:`KEEPER_SOURCE`), when the child ends,
when the grader asks and when the grader ends, however (even SIGKILL); as root a guard
(:func:`guard_as_root`) also ends every process of the grader's uids. :class:`Sandbox`
drives one submission's child: it has it read the notebook, runs the cells, asks for
calls and restarts the child after a crash or a hang (skipping the cell that caused it).
Every read and write has a deadline; every failure is an outcome with a reason.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from mhalib.grade import adapters, cgroup, seccomp, wire, worker

__all__ = ["Limits", "Isolation", "Sandbox", "Reading", "CallOutcome", "decide"]

NOBODY = 65534
UID_BASE = 2_000_000_000  # as root under bubblewrap: UID_BASE + 100 * (grader pid % 10**6) + job
COURSE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../mhalib
# The child's program, one script: its import path first (it runs with -I -S), then the
# wire format, the call adapters and the child itself (each skips its imports of the
# others when run as the script's __main__).
WORKER_SOURCE = "import json, sys\nsys.path.extend(json.loads(sys.argv[1])['path'])\n" + "\n\n".join(
    open(module.__file__, encoding="utf-8").read() for module in (wire, adapters, worker))  # noqa: SIM115 - read once


@dataclass
class Limits:
    """Resource limits of one submission's child process."""

    memory_mb: int = 2048  # address space (RLIMIT_AS); torch needs about 1 GiB
    cpu_s: int = 300  # CPU seconds for the whole child (RLIMIT_CPU)
    file_mb: int = 64  # largest file (RLIMIT_FSIZE), and the size of the private /tmp
    nproc: int = 64  # processes and threads of its user (RLIMIT_NPROC)
    call_timeout_s: float = 10.0  # wall clock per graded call
    cell_timeout_s: float = 60.0  # wall clock per notebook cell
    start_timeout_s: float = 60.0  # wall clock to start the child (torch included)
    notebook_budget_s: float = 300.0  # wall clock for running the cells, restarts included
    submission_s: float = 30.0  # wall clock for the whole submission: start, cells and every call


@dataclass
class CallOutcome:
    """One call: ``status`` is ok, not_implemented, grading_error, exception, forbidden,
    timeout, died, bad_reply or not_started."""

    status: str
    result: object = None
    message: str = ""
    where: str = ""
    hits: list = field(default_factory=list)
    after: list = field(default_factory=list)  # [(label, key, array)]: the inputs after the call
    kinds: list = field(default_factory=list)  # an exception's class name and its bases'


@dataclass(frozen=True)
class Isolation:
    """``kind``: ``"bubblewrap"``, ``"unprivileged user"``, ``"none"``, or empty when grading
    is refused (``problem`` says why)."""

    kind: str
    problem: str = ""
    tmp_size: bool = True  # bubblewrap caps the size of /tmp (0.8 and later)
    userns: bool = False  # bubblewrap in a user namespace (an ordinary user): the child is uid 65534

    @property
    def ok(self):
        """Whether grading may go ahead (some kind of isolation, or ``"none"`` as asked)."""
        return bool(self.kind)

    def describe(self, uid=None, limits=None):
        """One line for the report: the isolation, the child's ``uid`` and the ``limits`` in force."""
        limits = limits or Limits()
        if self.kind in ("bubblewrap", "unprivileged user"):
            problem = cgroup.support()
            caps = (f"{limits.memory_mb} MiB and {limits.nproc} processes for the whole submission (cgroup)"
                    + ("; an equal share of the CPU per submission (cgroup cpu weight)" if cgroup.shares_cpu() else
                       "; no CPU share of its own (no cgroup cpu controller)")
                    if not problem else f"memory and processes limited per process only (no cgroup: {problem})")
            caps += "; system calls filtered (seccomp)" if seccomp.supported() else "; no system-call filter here"
        if self.kind == "bubblewrap":
            size = f"of {limits.file_mb} MiB" if self.tmp_size else "(bubblewrap < 0.8: size capped by the cgroup only)"
            return (f"bubblewrap sandbox (uid {uid}; own PID, network and IPC namespaces; system read-only; "
                    f"no course files; private /tmp {size}; {caps})")
        if self.kind == "unprivileged user":
            return (f"user nobody (uid {NOBODY}) in a private folder, one submission per container; no bubblewrap; "
                    f"{caps}")
        if self.kind == "none":
            return f"none: the submission ran as {pwd.getpwuid(os.getuid()).pw_name}, unprotected (--no-isolation)"
        return f"none available: {self.problem}"

    @property
    def as_root(self):
        """bubblewrap started by root, without a user namespace: a uid of its own per job."""
        return self.kind == "bubblewrap" and os.geteuid() == 0 and not self.userns

    def uid(self, slot):
        """The uid the child of job ``slot`` runs as, or ``None`` when it runs as the grader."""
        if self.kind == "bubblewrap":
            return UID_BASE + 100 * (os.getpid() % 10**6) + slot % 100 if self.as_root else NOBODY
        return NOBODY if self.kind == "unprivileged user" else None

    def command(self, config, limits, slot, workdir):
        """``(argv, Popen keyword arguments)`` of a child; completes ``config``."""
        exe = os.path.join(sys.base_prefix, "bin", "python%d.%d" % sys.version_info[:2])
        exe, prefix = exe if os.path.exists(exe) else os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix)
        sites = list(dict.fromkeys(os.path.realpath(p) for p in sys.path if os.path.isdir(p)
                                   and os.path.basename(p) in ("site-packages", "dist-packages")))
        uid, root = self.uid(slot), self.as_root
        env = {"HOME": workdir, "TMPDIR": workdir, "MPLCONFIGDIR": workdir, "LANG": "C.UTF-8", "PATH": "/usr/bin:/bin",
               "USER": "student", "LOGNAME": "student", "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "TQDM_DISABLE": "1"}
        if self.kind != "none" and seccomp.supported():
            config.update(seccomp=seccomp.program().hex())
        config.update(limits={"memory_mb": limits.memory_mb, "cpu_s": limits.cpu_s, "file_mb": limits.file_mb,
                              "nproc": limits.nproc if self.kind != "none" else 0},
                      hidden=[COURSE_DIR], path=sites, uid=uid, gid=uid)
        python = [exe, "-I", "-S", "-c", WORKER_SOURCE]
        if self.kind != "bubblewrap":  # as nobody: the child changes its user itself, first thing
            return python + [json.dumps(config)], dict(env=env, cwd=workdir)
        config.update(path=[f"/site/{i}" for i in range(len(sites))], uid=uid if root else None)
        bwrap = shutil.which("bwrap") or "bwrap"
        # The child is PID 1 of its namespace where bubblewrap allows it (--as-pid-1): no
        # process of bubblewrap's is then visible in /proc to read or write.
        argv = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv",
                *(["--as-pid-1"] if _bwrap_has("--as-pid-1") else [])]
        argv += (["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if root  # drops itself
                 else ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY)])
        argv += ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            argv += (["--symlink", os.readlink(top), top] if os.path.islink(top) else
                     ["--ro-bind", top, top] if os.path.isdir(top) else [])
        argv += [x for p in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d") if os.path.exists(p)
                 for x in ("--ro-bind", p, p)]
        argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777"]  # --perms: for the /tmp below
        argv += (["--size", str(limits.file_mb << 20)] if self.tmp_size else []) + ["--tmpfs", "/tmp"]
        if not prefix.startswith("/usr/"):
            parts = prefix.strip("/").split("/")
            argv += [x for i in range(1, len(parts)) for x in ("--perms", "0755", "--dir", "/" + "/".join(parts[:i]))]
            argv += ["--ro-bind", prefix, prefix]
        if not exe.startswith((prefix + "/", "/usr/")):
            argv += ["--ro-bind", exe, exe]
        argv += ["--perms", "0755", "--dir", "/site"]
        for i, site in enumerate(sites):
            argv += ["--ro-bind", site, f"/site/{i}"]
            if os.path.isdir(os.path.join(site, "mhalib")):  # an installed course package: hidden
                argv += ["--tmpfs", f"/site/{i}/mhalib"]
        # Read-only from here: the sandbox's own root and /dev (both writable tmpfs for the
        # child in a user namespace otherwise, and not size-capped); /tmp stays the one
        # writable place, of its capped size.
        argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
        for key, value in dict(env, HOME="/tmp", TMPDIR="/tmp", MPLCONFIGDIR="/tmp").items():
            argv += ["--setenv", key, value]
        # bubblewrap itself starts with an empty environment too: nothing of the grader's
        # (tokens, paths) is in any process of the sandbox, not even in /proc/N/environ.
        return (argv + ["--chdir", "/tmp", "--"] + python + [json.dumps(config)],
                dict(cwd="/", env={"PATH": "/usr/bin:/bin"}))


# Each child's keeper: a child subreaper, so whatever the submission starts (double-forked,
# in its own session, its parent-death signal cleared) stays its descendant. It kills them
# all when the child ends, when the grader asks (a byte on its pipe) or goes (end of file:
# the grader holds the only write end), then, if the grader has gone, removes the control
# group and the child's working folder (a grader stopped by a signal cannot), and exits as
# the child did.
KEEPER_SOURCE = r"""import json, os, select, signal, sys, time
watch, folders, workdir, argv = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], sys.argv[4:]
os.set_inheritable(watch, False)
try:
    import ctypes
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
except (ImportError, OSError, AttributeError):
    pass
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.signal(signal.SIGCHLD, lambda *args: None)
signal.set_wakeup_fd(wake_w)
for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
    signal.signal(number, signal.SIG_IGN)
child = os.fork()
if child == 0:
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGCHLD):
        signal.signal(number, signal.SIG_DFL)
    try:
        os.execv(argv[0], argv)
    finally:
        os._exit(127)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
status = []


def reap():
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True
        if pid == child:
            status.append(code)


def descendants():
    found, todo = [], [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    kids = [int(p) for p in f.read().split()]
                found += kids
                todo += kids
        except (OSError, ValueError):
            pass
    return found


said = None
while not status:
    reap()
    if status:
        break
    ready = select.select([watch, wake_r], [], [], 1.0)[0]
    if watch in ready:
        said = os.read(watch, 1)  # b"k": the grader asks; b"": the grader has gone
        break
    if wake_r in ready:
        os.read(wake_r, 4096)
end = time.monotonic() + 10
while time.monotonic() < end:
    pids = descendants()
    for pid in pids:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    for folder in folders:
        try:
            with open(os.path.join(folder, "cgroup.kill"), "w") as f:
                f.write("1")
        except OSError:
            pass
    if not reap() and not pids:
        break
    time.sleep(0.005)
if said == b"":
    import shutil
    shutil.rmtree(workdir, ignore_errors=True)  # nothing of the submission runs any more
    for _ in range(100):
        for folder in list(folders):
            try:
                os.rmdir(folder)
                folders.remove(folder)
            except FileNotFoundError:
                folders.remove(folder)
            except OSError:
                pass
        if not folders:
            break
        time.sleep(0.02)
code = status[0] if status else 9
if os.WIFSIGNALED(code):
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(os.WTERMSIG(code), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(code))
    os._exit(128 + os.WTERMSIG(code))
os._exit(os.WEXITSTATUS(code) if os.WIFEXITED(code) else 1)
"""


# As root, the child's own parent-death signal never reaches it: bubblewrap, which would
# send it, keeps no capability (CAP_KILL) and the child runs as another user. Nor does a
# kill of bubblewrap alone: the child, PID 1 of its namespace, is left. One guard per grader
# process, started by root, waits for the grader to end (end of file on its stdin: the
# grader's only copy of the pipe goes with it, however it ends) and then kills every
# process of the grader's uids. The uids are its own: UID_BASE + 100 * (grader pid % 10**6)
# and the 100 after.
GUARD_SOURCE = """import os, sys
first = int(sys.argv[1])
while os.read(0, 4096):
    pass
for _ in range(3):
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                uids = [int(x) for line in f if line.startswith("Uid:") for x in line.split()[1:]]
            if any(first <= uid < first + 100 for uid in uids):
                os.kill(int(pid), 9)
        except (OSError, ValueError):
            pass
"""
_GUARDS, _GUARD_LOCK = {}, threading.Lock()


def guard_as_root():
    """Start this grader process's guard once (as root under bubblewrap only): whatever ends
    the grader, even SIGKILL, no child of its uids outlives it."""
    with _GUARD_LOCK:
        if os.getpid() in _GUARDS:
            return
        read, write = os.pipe()
        try:
            guard = subprocess.Popen([sys.executable, "-I", "-S", "-c", GUARD_SOURCE,
                                      str(UID_BASE + 100 * (os.getpid() % 10**6))],
                                     stdin=read, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     cwd="/", env={"PATH": "/usr/bin:/bin"}, start_new_session=True)
        except OSError:
            os.close(write)
            return
        finally:
            os.close(read)
        _GUARDS[os.getpid()] = (guard, write)
        atexit.register(_end_guard, os.getpid())


def _end_guard(pid):
    """At the grader's normal end: the guard does its sweep now, and is waited for."""
    if pid != os.getpid() or pid not in _GUARDS:
        return
    guard, write = _GUARDS.pop(pid)
    os.close(write)
    try:
        guard.wait(timeout=10)
    except subprocess.TimeoutExpired:
        guard.kill()


@functools.lru_cache(maxsize=None)
def _bwrap_has(option):
    """Whether this bubblewrap knows ``option`` (from ``bwrap --help``)."""
    try:
        out = subprocess.run([shutil.which("bwrap") or "bwrap", "--help"], capture_output=True, text=True,
                             timeout=10, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.SubprocessError):
        return False
    return option in out.stdout + out.stderr


@functools.lru_cache(maxsize=None)
def decide(unisolated=False, container=False):
    """The isolation of this grader process, decided once. ``unisolated``: the explicit
    opt-out; ``container``: a one-submission container (Gradescope's), where user ``nobody``
    is an option: every process of ``nobody`` is killed after the submission."""
    def _probe(isolation):  # "" when a child starts as it should, else what went wrong
        box = Sandbox(isolation, [])
        try:
            return box.spawn()
        finally:
            box.close()
    if unisolated:
        return Isolation("none")
    problems = []
    if shutil.which("bwrap"):
        userns = os.geteuid() != 0
        problem = _probe(Isolation("bubblewrap", userns=userns))
        if "--size" in problem and not _probe(Isolation("bubblewrap", tmp_size=False, userns=userns)):
            return Isolation("bubblewrap", tmp_size=False, userns=userns)  # bubblewrap before 0.8
        if not problem:
            return Isolation("bubblewrap", userns=userns)
        problems.append(f"bubblewrap does not run here ({problem})")
    else:
        problems.append("bubblewrap is not installed (Debian and Ubuntu: apt-get install bubblewrap)")
    if os.geteuid() != 0:
        problems.append("without bubblewrap an ordinary user cannot run submissions as another user")
    elif not container:
        problems.append("without bubblewrap, only a one-submission container (Gradescope) may run code as nobody")
    else:
        problem = _probe(Isolation("unprivileged user"))
        if not problem:
            return Isolation("unprivileged user")
        problems.append(f"user nobody cannot be used ({problem})")
    return Isolation("", problem="; ".join(problems))


def children_of(pid):
    """The pids whose parent is ``pid`` (Linux's /proc; empty elsewhere, or once it has gone)."""
    found = set()
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                found.update(int(p) for p in f.read().split())
        return sorted(found)
    except (OSError, ValueError):  # no children file in this kernel: every process's parent, read
        pass
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for p in pids:
        try:
            with open(f"/proc/{p}/stat", encoding="ascii", errors="replace") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.add(int(p))
        except (OSError, ValueError, IndexError):
            pass
    return sorted(found)


def kill_all_of(uid):
    """Every process of ``uid``: a helper running as that user signals them all."""
    try:
        subprocess.run([sys.executable, "-I", "-S", "-c", "import os\nfor _ in range(3):\n try:\n  os.kill(-1, 9)\n"
                        " except OSError:\n  break"], user=uid, group=uid, extra_groups=[], timeout=10, cwd="/",
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        pass


@dataclass
class Reading:
    """What the child read of a notebook (:meth:`Sandbox.read`): why it is not one
    (``problem``), or why it could not be read (``failure``), or what
    :func:`mhalib.grade.worker.read_notebook` gives."""

    problem: str = ""
    failure: str = ""
    exercise: str | None = None
    cells: list = field(default_factory=list)
    labels: dict = field(default_factory=dict)
    syntax: list = field(default_factory=list)
    notes: list = field(default_factory=list)


class Sandbox:
    """One submission's child: ``cells`` are ``[(index, source)]`` (plain Python, from
    :meth:`read`), ``preload`` the modules imported first (``("torch",)``), ``forbidden``
    each graded function's forbidden rules (both also later, by :meth:`prepare`), ``slot``
    the grading job (its own uid under bubblewrap as root)."""

    MAX_STARTS = 12

    def __init__(self, isolation, cells=(), *, preload=(), forbidden=(), limits=None, slot=0):
        self.isolation, self.limits, self.slot = isolation, limits or Limits(), slot
        self.prepare(cells, preload, forbidden)
        self.proc = self.workdir = self.uid = self._budget_end = self._watch = None
        self.cgroup, self._oom_kills = None, 0  # the submission's control group: None before, False where none
        self.skip, self.cell_errors, self.notes = set(), {}, []
        self.starts, self.printed, self.failure, self._set_up = 0, 0, "", False
        self.deadline = None  # the whole submission's wall clock (Limits.submission_s), from its first start

    def prepare(self, cells, preload=(), forbidden=()):
        """The cells to run and the exercise's set-up, once :meth:`read` has given them."""
        self.cells = list(cells)
        self.setup = {"op": "setup", "preload": list(preload), "forbidden": [list(f) for f in forbidden]}

    def _left(self, timeout):
        """``timeout``, cut to what is left of the submission's wall clock."""
        return timeout if self.deadline is None else max(0.0, min(timeout, self.deadline - time.monotonic()))

    def _clock(self):
        """The submission's wall clock starts with its first child."""
        if self.deadline is None:
            self.deadline = time.monotonic() + self.limits.submission_s

    @property
    def out_of_time(self):
        """Whether the submission's wall-clock time is used up."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _used_up(self):
        return f"the submission used up its {self.limits.submission_s:g} s of wall-clock time"

    def spawn(self):
        """Start the child: ``""`` when it is ready as it should be, else the reason (killed)."""
        self.kill()
        self.starts += 1
        self._set_up = False
        self.workdir = self.workdir or tempfile.mkdtemp(prefix="mhalib-grade-")
        uid = self.isolation.uid(self.slot)
        if self.isolation.kind == "unprivileged user":
            os.chown(self.workdir, uid, uid)
        if self.isolation.as_root:
            guard_as_root()
        argv, extra = self.isolation.command({}, self.limits, self.slot, self.workdir)
        if self.cgroup is None and self.isolation.kind in ("bubblewrap", "unprivileged user"):
            self.cgroup = False  # where the grader has none at all (the report says so)
            if not cgroup.support():
                try:
                    self.cgroup = cgroup.Cgroup.create(self.limits.memory_mb, self.limits.nproc, tag=f"{self.slot}-")
                except cgroup.Unavailable as exc:  # promised by the report: never graded without it
                    self.cgroup = None
                    self.failure = f"the submission's control group could not be made ({exc})"
                    return self.failure
        if self.cgroup:
            argv, self._oom_kills = self.cgroup.wrap(argv), self.cgroup.oom_kills()
        cut = self._left(self.limits.start_timeout_s)
        watch, self._watch = os.pipe()  # the keeper's: its only write end stays here
        try:
            keeper = [sys.executable, "-I", "-S", "-c", KEEPER_SOURCE, str(watch),
                      json.dumps(list(self.cgroup.folders) if self.cgroup else []), self.workdir]
            self.proc = subprocess.Popen(keeper + argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, start_new_session=True, pass_fds=(watch,), **extra)
            os.set_blocking(self.proc.stdin.fileno(), False)
            head, _ = worker.recv(self.proc.stdout.fileno(), time.monotonic() + cut)
        except (OSError, subprocess.SubprocessError, worker.ProtocolError) as exc:
            said, proc = "", self.proc
            if proc is not None:
                self._end_keeper()  # the keeper ends the child and all it started, then itself
                try:
                    said = proc.communicate(timeout=10)[1].decode(errors="replace").strip()
                except (OSError, ValueError, subprocess.SubprocessError):
                    pass
            self.failure = ("the child could not drop its privileges" if proc and proc.returncode == worker.DENIED_EXIT
                            else "the child could not install its system-call filter (seccomp)"
                            if proc and proc.returncode == worker.FILTER_EXIT
                            else f"the child did not start within {self.limits.start_timeout_s:g} s"
                            if isinstance(exc, worker.Timeout) and cut >= self.limits.start_timeout_s
                            else f"the child did not start: {self._used_up()}" if isinstance(exc, worker.Timeout)
                            else (said.splitlines()[-1] if said else f"{type(exc).__name__}: {exc}")[:300])
        else:
            expected = uid if uid is not None else os.getuid()
            self.failure = ("" if head.get("op") == "ready" and head.get("uid") == head.get("euid") == expected else
                            f"the child started as uid {head.get('uid')!r}, not {expected}")
            if not self.failure and head.get("sees") and self.isolation.kind != "none":
                # without isolation the course is readable, as in the learner's own Jupyter;
                # the worker's import guard still gives graded code no mhalib
                self.failure = f"the child can read {', '.join(map(str, head['sees']))}"
            self.uid = expected
        finally:
            os.close(watch)
        if self.failure:
            self.kill()
        return self.failure

    def read(self, data):
        """A new child reads the notebook ``data`` (its bytes), under its limits and the
        submission's clock; returns a :class:`Reading` (never raises). The child stays, for
        :meth:`start`."""
        self._clock()
        problem = self.spawn()
        if problem:
            self.starts = self.MAX_STARTS
            return Reading(failure=f"the grading process could not start: {problem}")
        bytes_ = np.frombuffer(data, dtype=np.uint8)
        reply = self._request({"op": "read", "seconds": worker.IPYTHON_SECONDS}, [bytes_],
                              self.limits.start_timeout_s)
        if reply is None:
            return Reading(failure=f"the notebook could not be read: the grading process {self.failure}")
        head, arrays = reply
        try:
            if head.get("problem"):
                return Reading(problem=str(head["problem"]))
            text = arrays[0].tobytes() if len(arrays) == 1 and arrays[0].dtype == np.uint8 else b""
            cells, at = [], 0
            for index, size in head.get("cells", []):
                if type(index) is not int or type(size) is not int or not 0 <= size <= len(text) - at:
                    raise ValueError("a cell outside the text")
                cells.append((index, text[at:at + size].decode("utf-8", "surrogatepass")))
                at += size
            labels = {int(k): worker.clean(v, 120) for k, v in dict(head.get("labels", {})).items()}
            syntax = [(int(i), line if type(line) is int else None, worker.clean(m, 250))
                      for i, line, m in head.get("syntax", [])]
            exercise = head.get("exercise")
            return Reading(exercise=worker.clean(exercise, 200) if isinstance(exercise, str) else None,
                           cells=cells, labels=labels, syntax=syntax,
                           notes=[worker.clean(n, 300) for n in head.get("notes", [])[:20]])
        except (TypeError, ValueError, AttributeError, UnicodeDecodeError) as exc:
            self.kill()
            return Reading(failure=f"the notebook could not be read: the grading process sent back something "
                           f"the grader cannot read ({str(exc)[:100]})")

    def _setup(self):
        """Set the child up for the exercise (forbidden calls, torch): ``""`` or why not."""
        cut = self._left(self.limits.start_timeout_s)
        reply = self._request(self.setup, (), self.limits.start_timeout_s)
        if reply is None and self.failure.startswith("did not finish"):  # a deadline: the step's, or the clock's
            failure = (f"the child did not start within {self.limits.start_timeout_s:g} s"
                       if cut >= self.limits.start_timeout_s else f"the child did not start: {self._used_up()}")
        elif reply is None:
            failure = f"the child {self.failure}"
        else:
            failure = f"the child could not be set up ({worker.clean(reply[0]['error'], 200)})" \
                if reply[0].get("error") else ""
        self._set_up = not failure
        if failure:
            self.failure = failure
            self.kill()
        return failure

    def start(self):
        """(Re)start the child and run the cells; a cell that hangs or kills it is skipped."""
        self._clock()
        while self.starts < self.MAX_STARTS or (self.alive and not self._set_up):
            if self.out_of_time:
                self.failure = self._used_up()
                self.starts = self.MAX_STARTS
                self.kill()
                return self
            problem = ("" if self.alive else self.spawn()) or self._setup()
            if problem:  # not the submission's doing (no learner code ran): never tried again
                self.notes.append(f"the grading process could not start: {problem}")
                self.starts, self.failure = self.MAX_STARTS, f"the grading process could not start ({problem})"
                return self
            self._budget_end = self._budget_end or time.monotonic() + self.limits.notebook_budget_s
            for index, source in self.cells:
                if index in self.skip:
                    continue
                if time.monotonic() > self._budget_end or self.out_of_time:
                    self.skip.add(index)
                    self.notes.append(f"cell {index} was not run: the notebook used up its "
                                      f"{min(self.limits.notebook_budget_s, self.limits.submission_s):g} s")
                    continue
                reply = self._request({"op": "exec", "source": source, "index": index}, (), self.limits.cell_timeout_s)
                if reply is None:  # it hung or killed the process: skipped from now on
                    self.skip.add(index)
                    self.notes.append(f"cell {index} {self.failure}; it was skipped")
                    break
                if reply[0].get("error"):
                    self.cell_errors[index] = str(reply[0]["error"])
            else:
                return self
        self.failure = f"the grading process was restarted {self.MAX_STARTS} times"
        return self

    @property
    def alive(self):
        """Whether the child (its keeper) is running."""
        return self.proc is not None and self.proc.poll() is None

    def _end_keeper(self):
        """Ask the keeper to end the child and all it started (closing the only write end of its pipe)."""
        watch, self._watch = self._watch, None
        if watch is not None:
            try:
                os.write(watch, b"k")
            except OSError:
                pass
            os.close(watch)

    def kill(self):
        """Kill the child and everything it started (its keeper does: the whole tree and the
        cgroup); nothing without a child."""
        proc, self.proc = self.proc, None
        self._end_keeper()
        if proc is None:
            return
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a keeper that does not end: its tree, its session, itself
            for pid in children_of(proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()
        if self.cgroup:  # whatever of the submission is left, wherever it went
            self.cgroup.kill()
        if self.isolation.kind == "unprivileged user":
            kill_all_of(NOBODY)

    def close(self):
        """Ask the child to exit, kill what is left, and remove the cgroup and the working folder."""
        if self.alive:
            try:
                worker.send(self.proc.stdin.fileno(), {"op": "exit"}, deadline=time.monotonic() + 1)
            except (OSError, worker.ProtocolError):
                pass
        self.kill()
        if self.cgroup:
            self.cgroup.remove()
        self.cgroup = None
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def _request(self, header, arrays, timeout):
        """One request and its reply ``(header, arrays)``, or ``None`` with ``self.failure``
        saying what went wrong (the child is then killed)."""
        if not self.alive:
            self.failure = "could not run: the grading process had stopped"
            return None
        cut = self._left(timeout)
        deadline = time.monotonic() + cut
        try:
            worker.send(self.proc.stdin.fileno(), header, arrays, deadline=deadline)
            reply = worker.recv(self.proc.stdout.fileno(), deadline)
            printed = reply[0].get("printed", 0)
            if type(printed) is not int or not 0 <= printed < 1 << 50:
                raise worker.ProtocolError(f"a reply whose printed count is {str(printed)[:30]}")
            self.printed += printed
            return reply
        except worker.Timeout:
            self.failure = (f"did not finish within {timeout:g} s" if cut >= timeout else
                            f"did not finish: {self._used_up()}")
        except worker.Closed:
            self.failure = self._death()
        except Exception as exc:  # noqa: BLE001 - a forged or overflowing reply: the child's fault, never ours
            self.failure = f"sent back something the grader cannot read ({str(exc)[:100]})"
        self.kill()
        return None

    def _death(self):
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "closed its connection to the grader"
        code = 128 - code if self.isolation.kind == "bubblewrap" and code > 128 else code  # signal N: 128 + N
        if self.cgroup and self.cgroup.oom_kills() > self._oom_kills:
            return (f"was killed: its processes together used more than the submission's {self.limits.memory_mb} MiB "
                    "of memory")
        if code in (-signal.SIGXCPU, -signal.SIGKILL):
            return (f"used up the CPU time limit ({self.limits.cpu_s} s)" if code == -signal.SIGXCPU
                    else "was killed (out of memory, or a limit)")
        return f"crashed the process (signal {-code})" if code < 0 else \
            f"ended the process (exit code {code}, e.g. os._exit)"

    def call(self, adapter, name, args, kwargs, params, forbidden, encode=worker.encode_value):
        """Run one case in the child; returns a :class:`CallOutcome` (never raises)."""
        if not self.alive and self.starts < self.MAX_STARTS:
            self.start()
        if not self.alive:
            return CallOutcome("not_started", message=f"{name} could not run: {self.failure}")
        if self.out_of_time:
            return CallOutcome("timeout", message=f"{name} was not run: the submission used up its "
                               f"{self.limits.submission_s:g} s of wall-clock time")
        arrays = []
        header = {"op": "call", "adapter": adapter, "name": name, "params": params, "forbidden": list(forbidden),
                  "args": [encode(a, arrays) for a in args], "kwargs": {k: encode(v, arrays) for k, v in kwargs.items()}}
        reply = self._request(header, arrays, self.limits.call_timeout_s)
        if reply is None:
            return CallOutcome("timeout" if self.failure.startswith("did not finish") else "died",
                               message=f"{name} {self.failure}")
        head, out = reply
        try:
            if head.get("status") == "ok":
                after = [(str(label), key, worker.decode_value(tree, out))
                         for label, key, tree in head.get("after", [])[:16] if type(key) in (int, str)]
                return CallOutcome("ok", result=worker.decode_value(head.get("result"), out), after=after)
            if head.get("status") in ("grading_error", "not_implemented", "exception", "forbidden"):
                return CallOutcome(head["status"], message=str(head.get("message", "")),
                                   where=str(head.get("where", "")), hits=[str(h) for h in head.get("hits", [])][:10],
                                   kinds=[str(k) for k in head.get("kinds", [])][:12])
        except Exception:  # noqa: BLE001 - whatever a forged reply holds, it is unreadable, not our error
            pass
        self.kill()
        return CallOutcome("bad_reply", message=f"{name}: the grading process sent back something unreadable")
