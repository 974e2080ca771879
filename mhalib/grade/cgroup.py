"""One submission's memory, processes and CPU, counted over all its processes: a control group.

A per-process limit (``RLIMIT_AS``) does not hold a submission that forks, or that keeps
its data in memfds, shared memory or tmpfs files, which no address space counts. A control
group does: the kernel charges every page of every process in it, files in memory
included, and counts its processes and threads. Each :class:`~mhalib.grade.sandbox.Sandbox`
makes one (``memory`` at ``Limits.memory_mb``, no swap; ``pids`` at ``Limits.nproc``; and,
where the ``cpu`` controller is there, an equal CPU weight: the scheduler then shares the
processors between the submissions graded side by side, not between their processes, so
that 60 spinning processes of one submission take no more than one classmate's single
one); its child is moved in by a small shell before bubblewrap or Python starts, so
nothing of the submission ever runs outside it; it is emptied (every process killed) and
removed when the submission is done.

Where: cgroup v2 (``/sys/fs/cgroup`` unified) under the grader's own group, which needs
``memory`` and ``pids`` (and ``cpu`` for the share) delegated to it (root in a container
usually has them); cgroup v1 (``/sys/fs/cgroup/memory``, ``/sys/fs/cgroup/pids`` and
``/sys/fs/cgroup/cpu``) under the grader's own groups. An ordinary user without a delegated
group has none: :func:`support` says why, the grader's report says so, and the
per-process limits are all there is.
"""

from __future__ import annotations

import functools
import os
import signal
import time
import uuid

__all__ = ["Cgroup", "Unavailable", "support", "shares_cpu"]

ROOT = "/sys/fs/cgroup"
PREFIX = "mhalib-grade-"
CPU_WEIGHT, CPU_SHARES = 100, 1024  # each submission's CPU weight: v2's cpu.weight and v1's cpu.shares (the defaults)
_ACTIVE = set()  # the names of this process's groups in use


class Unavailable(OSError):
    """No control group can be made here; the message says why."""


def _own_path(controller):
    """This process's group in the hierarchy of ``controller`` (``""``: the v2 line); v1
    controllers mounted together (``cpu,cpuacct``) share a line."""
    try:
        with open("/proc/self/cgroup", encoding="ascii") as f:
            for line in f:
                _, names, path = line.rstrip("\n").split(":", 2)
                if controller in names.split(",") if controller else names == "":
                    return path
    except (OSError, ValueError):
        pass
    return "/"


def _parents():
    """``(version, [(controller, parent folder)])`` where this grader may make its groups."""
    if os.path.exists(os.path.join(ROOT, "cgroup.controllers")):  # the unified hierarchy
        return 2, [("", os.path.join(ROOT, _own_path("").lstrip("/")))]
    found = []
    for controller in ("memory", "pids", "cpu"):
        mount = os.path.join(ROOT, controller)  # "cpu" is often a link to "cpu,cpuacct"
        if not os.path.exists(os.path.join(mount, "cgroup.procs")):
            if controller == "cpu":  # the share is reported as missing; memory and processes are not optional
                continue
            raise Unavailable(f"no cgroup {controller} controller mounted at {mount}")
        own = os.path.join(mount, _own_path(controller).lstrip("/"))
        found.append((controller, own if os.path.isdir(own) else mount))
    return 1, found


def _write(path, text):
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


def _read(path):
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except OSError:
        return ""


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


class Cgroup:
    """One submission's group(s): ``folders`` (one in v2; ``memory``, ``pids`` and ``cpu`` in
    v1); ``cpu``: whether it has a CPU weight of its own."""

    def __init__(self, version, folders, cpu=False):
        self.version, self.folders, self.cpu = version, folders, cpu

    @classmethod
    def create(cls, memory_mb, nproc, tag=""):
        """A new group of at most ``memory_mb`` MiB (no swap) and ``nproc`` processes and
        threads, with an equal CPU weight where the ``cpu`` controller can be had;
        :class:`Unavailable` where none can be made."""
        try:
            version, parents = _parents()
        except OSError as exc:
            raise Unavailable(str(exc)) from None
        name = f"{PREFIX}{os.getpid()}-{tag}{uuid.uuid4().hex[:8]}"
        folders, cpu = [], False
        try:
            if version == 2:
                parent = parents[0][1]
                enabled = _read(os.path.join(parent, "cgroup.subtree_control")).split()
                cpu = "cpu" in _read(os.path.join(parent, "cgroup.controllers")).split()
                missing = [c for c in ("memory", "pids") + (("cpu",) if cpu else ()) if c not in enabled]
                if missing:  # fails (EBUSY) where the grader's group holds processes and is not the root
                    _write(os.path.join(parent, "cgroup.subtree_control"), " ".join("+" + c for c in missing))
                _sweep(parent)
                folder = os.path.join(parent, name)
                os.mkdir(folder)
                folders.append(folder)
                _write(os.path.join(folder, "memory.max"), str(memory_mb << 20))
                if os.path.exists(os.path.join(folder, "memory.swap.max")):
                    _write(os.path.join(folder, "memory.swap.max"), "0")
                _write(os.path.join(folder, "pids.max"), str(nproc))
                if cpu:
                    _write(os.path.join(folder, "cpu.weight"), str(CPU_WEIGHT))
            else:
                for controller, parent in parents:
                    _sweep(parent)
                    folder = os.path.join(parent, name)
                    os.mkdir(folder)
                    folders.append(folder)
                    if controller == "memory":
                        _write(os.path.join(folder, "memory.limit_in_bytes"), str(memory_mb << 20))
                        if os.path.exists(os.path.join(folder, "memory.memsw.limit_in_bytes")):
                            _write(os.path.join(folder, "memory.memsw.limit_in_bytes"), str(memory_mb << 20))
                    elif controller == "pids":
                        _write(os.path.join(folder, "pids.max"), str(nproc))
                    else:
                        _write(os.path.join(folder, "cpu.shares"), str(CPU_SHARES))
                        cpu = True
        except OSError as exc:
            Cgroup(version, folders).remove()
            where = exc.filename or (parents[0][1] if parents else ROOT)
            raise Unavailable(f"cgroup v{version}: {exc.strerror or exc} ({where})") from None
        _ACTIVE.add(name)
        return cls(version, folders, cpu)

    def wrap(self, argv):
        """``argv`` started by a shell that first moves itself into the group (then ``exec``)."""
        moves = " && ".join(f'echo $$ > "${i + 1}"' for i in range(len(self.folders)))
        return (["/bin/sh", "-c", f'{moves} && shift {len(self.folders)} && exec "$@"', "sh"]
                + [os.path.join(f, "cgroup.procs") for f in self.folders] + list(argv))

    def pids(self):
        """The sorted process ids now in the group, over all its folders."""
        return sorted({int(p) for f in self.folders for p in _read(os.path.join(f, "cgroup.procs")).split()})

    def oom_kills(self):
        """How many of its processes the kernel killed for the memory limit (0 if unknown)."""
        for folder in self.folders:
            for name in ("memory.events", "memory.oom_control"):
                for line in _read(os.path.join(folder, name)).splitlines():
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        return 0

    def kill(self):
        """Every process in the group, killed; returns once none is left (or after 5 s)."""
        end = time.monotonic() + 5
        while time.monotonic() < end:
            pids = self.pids()
            if not pids:
                return
            if self.version == 2 and os.path.exists(os.path.join(self.folders[0], "cgroup.kill")):
                try:
                    _write(os.path.join(self.folders[0], "cgroup.kill"), "1")
                except OSError:
                    pass
            for pid in pids:
                self._kill_member(pid)
            time.sleep(0.02)

    def _kill_member(self, pid):
        """SIGKILL to ``pid`` if it is still this group's: through a pidfd, opened before the
        check, so that a pid reused by another process in between is never signalled."""
        name = os.path.basename(self.folders[0])
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # no pidfd here (Python or kernel): the pid itself
            fd = None
        try:
            with open(f"/proc/{pid}/cgroup", encoding="ascii") as f:
                if f"/{name}" not in f.read():
                    return
            if fd is None:
                os.kill(pid, signal.SIGKILL)
            else:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            if fd is not None:
                os.close(fd)

    def remove(self):
        """Kill what is left and remove the group; one that cannot be removed yet (a process
        still exiting) is removed by the next :func:`_sweep` of this grader or another."""
        self.kill()
        for folder in self.folders:
            for _ in range(50):
                try:
                    os.rmdir(folder)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)
        _ACTIVE.difference_update(os.path.basename(f) for f in self.folders)
        self.folders = []


def _sweep(parent, min_age_s=60):
    """Empty groups left behind: this grader's that are no longer in use, and those of graders
    that have ended (killed before they could remove them). Only groups older than
    ``min_age_s``: a grader in another PID namespace (its pid not visible here) is never
    robbed of the group it has just made. ``rmdir`` removes only an empty group."""
    try:
        names = [n for n in os.listdir(parent) if n.startswith(PREFIX) and n not in _ACTIVE]
    except OSError:
        return
    for name in names:
        try:
            pid = int(name[len(PREFIX):].split("-")[0])
            old = time.time() - os.stat(os.path.join(parent, name)).st_mtime > min_age_s
        except (ValueError, OSError):
            continue
        if old and (pid == os.getpid() or not _alive(pid)):
            try:
                os.rmdir(os.path.join(parent, name))
            except OSError:
                pass


@functools.lru_cache(maxsize=None)
def _probe():
    try:
        group = Cgroup.create(64, 8, tag="probe-")
    except Unavailable as exc:
        return str(exc), False
    group.remove()
    return "", group.cpu


def support():
    """``""`` where this grader can give each submission a group, else why not."""
    return _probe()[0]


def shares_cpu():
    """Whether each submission's group also has a CPU weight of its own (the ``cpu`` controller)."""
    return _probe()[1]
