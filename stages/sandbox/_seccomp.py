"""The sandbox's seccomp filter (standard library only): no new processes, no keyrings.

bwrap loads it (``--seccomp FD``) just before it executes the launcher, so it binds the
launcher and the program, not the sandbox's set-up. It refuses, with ``EAGAIN``:

- ``clone``, ``clone3``, ``fork``, ``vfork``: the program can neither fork nor start a
  thread. RLIMIT_NPROC says the same for an unprivileged user, but a sandbox started by
  root runs as kernel uid 0, which that limit exempts; this holds for every user;
- ``add_key``, ``request_key``, ``keyctl``: kernel keyrings are keyed by the kernel uid,
  so a sandbox started by root would otherwise reach root's user keyring.

Every system call made through another ABI (i386 or x32 calls from a 64-bit process,
whose numbers differ) is refused with ``ENOSYS``. On an architecture this filter does
not know, :func:`program` returns None and the sandbox runs without it (RLIMIT_NPROC
still binds unprivileged users there).

Kernel reference: Documentation/userspace-api/seccomp_filter.rst (classic BPF over
``struct seccomp_data``: ``nr`` at offset 0, ``arch`` at offset 4).
"""

from __future__ import annotations

import errno
import platform
import struct

_LD_W_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_X32 = 0x40000000

_ARCH = {  # machine: (AUDIT_ARCH, {syscall: number}, refuse x32 numbers)
    "x86_64": (0xC000003E, {"clone": 56, "fork": 57, "vfork": 58, "clone3": 435,
                            "add_key": 248, "request_key": 249, "keyctl": 250}, True),
    "aarch64": (0xC00000B7, {"clone": 220, "clone3": 435, "add_key": 217,
                             "request_key": 218, "keyctl": 219}, False),
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The filter as bwrap reads it (an array of ``struct sock_filter``), or None on an
    architecture it does not know."""
    entry = _ARCH.get(machine or platform.machine())
    if entry is None:
        return None
    arch, numbers, x32 = entry
    refused = sorted(numbers.values())
    ops = [_op(_LD_W_ABS, 4), _op(_JEQ, arch, jt=1), _op(_RET, _ERRNO | errno.ENOSYS),
           _op(_LD_W_ABS, 0)]
    if x32:
        ops += [_op(_JGE, _X32, jf=1), _op(_RET, _ERRNO | errno.ENOSYS)]
    for i, nr in enumerate(refused):  # jump to the final refusal past the other tests
        ops.append(_op(_JEQ, nr, jt=len(refused) - i))
    ops += [_op(_RET, _ALLOW), _op(_RET, _ERRNO | errno.EAGAIN)]
    return b"".join(ops)
