"""The system-call filter, read by a small interpreter of classic BPF: what it answers for
each call, on both architectures it knows, without running anything in the kernel.
(tests/test_grader_attacks.py::test_14 runs it in the sandbox.)"""

from __future__ import annotations

import errno
import struct

import pytest

from mhalib.grade import seccomp

EPERM, ENOSYS = seccomp.ERRNO | errno.EPERM, seccomp.ERRNO | errno.ENOSYS
EAFNOSUPPORT = seccomp.ERRNO | errno.EAFNOSUPPORT
# socket() and socketpair(), from the kernel's tables (arch/x86/entry/syscalls/syscall_64.tbl and
# include/uapi/asm-generic/unistd.h), and the families of include/linux/socket.h
SOCKET_CALLS = {"x86_64": {"socket": 41, "socketpair": 53}, "aarch64": {"socket": 198, "socketpair": 199}}
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_ALG, AF_VSOCK = 1, 2, 10, 16, 17, 38, 40
# A few calls every Python process makes: (x86-64, arm64).
EVERYDAY = {"read": (0, 63), "write": (1, 64), "openat": (257, 56), "mmap": (9, 222), "futex": (202, 98),
            "exit_group": (231, 94), "rt_sigaction": (13, 134), "memfd_create": (319, 279)}
CLONE_THREAD_FLAGS = 0x003D0F00  # what the C library passes clone() for a thread
SIGCHLD = 17


def run(program, nr, arch, arg0=0):
    """What the filter answers for call ``nr`` of ``arch`` with first argument ``arg0``."""
    data = struct.pack("=IIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    code = [struct.unpack_from("=HBBI", program, i) for i in range(0, len(program), 8)]
    pc = acc = 0
    for _ in range(len(code) + 1):  # no loops in seccomp: each instruction at most once
        op, jt, jf, k = code[pc]
        if op == seccomp.LD_W_ABS:
            acc, pc = struct.unpack_from("=I", data, k)[0], pc + 1
        elif op in (seccomp.JEQ, seccomp.JGE, seccomp.JSET):
            taken = acc == k if op == seccomp.JEQ else acc >= k if op == seccomp.JGE else bool(acc & k)
            pc += 1 + (jt if taken else jf)
        elif op == seccomp.RET:
            return k
        else:
            raise AssertionError(f"unknown instruction {op:#x}")
    raise AssertionError("the program ran off its end")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_every_denied_call_is_refused_and_everyday_calls_pass(machine):
    program, arch = seccomp.program(machine), seccomp.AUDIT_ARCH[machine]
    column = 0 if machine == "x86_64" else 1
    for name, numbers in seccomp.DENIED.items():
        if numbers[column] is not None:
            assert run(program, numbers[column], arch) == EPERM, name
    for name, numbers in EVERYDAY.items():
        assert run(program, numbers[column], arch) == seccomp.ALLOW, name
    assert run(program, seccomp.CLONE3, arch) == ENOSYS  # the C library falls back to clone
    clone = seccomp.CLONE[machine]
    assert run(program, clone, arch, CLONE_THREAD_FLAGS) == seccomp.ALLOW
    assert run(program, clone, arch, SIGCHLD) == seccomp.ALLOW  # fork
    for flag in (0x10000000, 0x20000000, 0x40000000, 0x00020000):  # NEWUSER, NEWPID, NEWNET, NEWNS
        assert run(program, clone, arch, SIGCHLD | flag) == EPERM, hex(flag)


def test_another_architecture_is_killed():
    program = seccomp.program("x86_64")
    assert run(program, 0, 0x40000003) == seccomp.KILL_PROCESS  # i386's read
    assert run(program, 0 | seccomp.X32_BIT, seccomp.AUDIT_ARCH["x86_64"]) == EPERM  # x32's read
    assert run(seccomp.program("aarch64"), 63, seccomp.AUDIT_ARCH["x86_64"]) == seccomp.KILL_PROCESS


def test_an_unknown_machine_is_a_clear_error():
    with pytest.raises(ValueError, match="x86_64 or aarch64 only"):
        seccomp.program("riscv64")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_every_socket_family_but_unix_is_refused(machine):
    """socket() and socketpair() answer EAFNOSUPPORT for every family but AF_UNIX (AF_VSOCK, a
    virtual machine's host ports, among them); only the low 32 bits of the family count, as
    the kernel reads an int."""
    program, arch = seccomp.program(machine), seccomp.AUDIT_ARCH[machine]
    for name, number in SOCKET_CALLS[machine].items():
        assert run(program, number, arch, AF_UNIX) == seccomp.ALLOW, name
        assert run(program, number, arch, (7 << 32) | AF_UNIX) == seccomp.ALLOW, name
        for family in (AF_VSOCK, AF_NETLINK, AF_PACKET, AF_ALG, AF_INET, AF_INET6, 0, 45, 255, 1 << 16):
            assert run(program, number, arch, family) == EAFNOSUPPORT, (name, family)
        assert all(run(program, number, arch, family) == EAFNOSUPPORT for family in range(2, 64)), name
