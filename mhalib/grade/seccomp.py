"""The system-call filter of a submission's child: a seccomp program, built here as bytes.

The child installs it on itself (:func:`mhalib.grade.worker._confine`) after its limits
and its change of user, before any learner code runs; every process and thread it starts
inherits it and none can remove it. It refuses, with ``EPERM``, the calls a notebook has no
use for and an attack does: the kernel keyrings (which outlive the process and are shared
by a uid), tracing and reading other processes, eBPF, userfaultfd, performance counters,
io_uring, namespaces (``unshare``, ``setns``, and ``clone`` with a namespace flag), mounts,
kernel modules and the like. ``clone3`` answers ``ENOSYS``, so that the C library falls
back to ``clone``, whose flags a filter can read. ``socket`` and ``socketpair`` answer
``EAFNOSUPPORT`` (as the kernel does for a family it does not have) for every family but
``AF_UNIX``: the child talks to the grader over pipes and needs no network, and families
such as ``AF_VSOCK`` (a virtual machine's host), ``AF_NETLINK`` (the kernel's own
interfaces), ``AF_PACKET``, ``AF_ALG`` and ``AF_INET`` (the container's network where
there is no network namespace) reach outside the sandbox. A call of another
architecture (32-bit calls on x86-64) ends the process.

The program is classic BPF over ``struct seccomp_data`` (the call's number at byte 0, the
architecture at byte 4, its arguments from byte 16), as the kernel's
``Documentation/userspace-api/seccomp_filter.rst`` describes it.
"""

from __future__ import annotations

import errno
import platform
import struct

__all__ = ["DENIED", "program", "supported"]

# The refused calls: name -> (number on x86-64, number on arm64); None where it does not exist.
DENIED = {
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438), "kcmp": (312, 272),
    "bpf": (321, 280), "userfaultfd": (323, 282), "perf_event_open": (298, 241),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "unshare": (272, 97), "setns": (308, 268),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "name_to_handle_at": (303, 264), "open_by_handle_at": (304, 265),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "reboot": (169, 142),
    "swapon": (167, 224), "swapoff": (168, 225), "syslog": (103, 116), "acct": (163, 89),
    "quotactl": (179, 60), "quotactl_fd": (443, 443), "lookup_dcookie": (212, 18), "fanotify_init": (300, 262),
    "open_tree_attr": (467, 467), "statmount": (457, 457), "listmount": (458, 458),
    "memfd_secret": (447, 447),  # secret memory splits the kernel's direct map: slow for the whole machine
    "iopl": (172, None), "ioperm": (173, None),
}
CLONE, CLONE3 = {"x86_64": 56, "aarch64": 220}, 435
SOCKET_CALLS = {"x86_64": (41, 53), "aarch64": (198, 199)}  # socket, socketpair: the family is the first argument
AF_UNIX = 1  # the one socket family allowed
# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_BIT = 0x40000000  # x86-64's x32 calls: the same numbers with this bit set

LD_W_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, ...|JGE|K, ...|JSET|K, BPF_RET|K
ALLOW, KILL_PROCESS, ERRNO = 0x7FFF0000, 0x80000000, 0x00050000


def _machine():
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def supported():
    """Whether this machine is one the filter knows (Linux on x86-64 or arm64)."""
    return platform.system() == "Linux" and _machine() in AUDIT_ARCH


def program(machine=None):
    """The filter for ``machine`` (``"x86_64"`` or ``"aarch64"``; this machine's by default) as
    the bytes of its ``struct sock_filter`` array (8 bytes an instruction)."""
    if machine is None and not supported():
        raise OSError(f"no system-call filter for {platform.system()} on {_machine()} (Linux on x86_64 or aarch64 only)")
    machine = machine or _machine()
    if machine not in AUDIT_ARCH:
        raise ValueError(f"no system-call filter for {machine!r}: x86_64 or aarch64 only")
    column = 0 if machine == "x86_64" else 1
    numbers = sorted({n[column] for n in DENIED.values() if n[column] is not None})
    code = [(LD_W_ABS, 0, 0, 4),  # the architecture
            (JEQ, 1, 0, AUDIT_ARCH[machine]),
            (RET, 0, 0, KILL_PROCESS),
            (LD_W_ABS, 0, 0, 0)]  # the call's number
    # Jumps below are written as targets ("deny", "enosys", "clone") and resolved once the
    # program's length is known: a conditional jump skips at most 255 instructions.
    body = []
    if machine == "x86_64":
        body.append((JGE, "deny", None, X32_BIT))
    body += [(JEQ, "deny", None, n) for n in numbers]
    body += [(JEQ, "socket", None, n) for n in SOCKET_CALLS[machine]]
    body += [(JEQ, "enosys", None, CLONE3), (JEQ, "clone", None, CLONE[machine]), (RET, 0, 0, ALLOW)]
    tail = {"clone": [(LD_W_ABS, 0, 0, 16),  # clone's flags: the low half of its first argument
                      (JSET, "deny", None, CLONE_NAMESPACES), (RET, 0, 0, ALLOW)],
            "socket": [(LD_W_ABS, 0, 0, 16),  # the family: the low half of the first argument (an int)
                       (JEQ, "allow", None, AF_UNIX), (RET, 0, 0, ERRNO | errno.EAFNOSUPPORT)],
            "allow": [(RET, 0, 0, ALLOW)],
            "deny": [(RET, 0, 0, ERRNO | errno.EPERM)],
            "enosys": [(RET, 0, 0, ERRNO | errno.ENOSYS)]}
    start = len(code) + len(body)
    labels = {}
    for name, block in tail.items():
        labels[name] = start
        start += len(block)
    out = code + body + [instruction for block in tail.values() for instruction in block]
    resolved = []
    for i, (op, jt, jf, k) in enumerate(out):
        if isinstance(jt, str):
            jt = labels[jt] - i - 1
            jf = 0
            if not 0 <= jt <= 255:
                raise AssertionError(f"jump of {jt} instructions in the filter")
        resolved.append(struct.pack("=HBBI", op, jt, jf, k))
    return b"".join(resolved)
