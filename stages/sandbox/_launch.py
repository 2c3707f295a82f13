"""Sandbox launcher: the first code to run inside a sandbox (standard library only).

:mod:`stages.sandbox` starts it as ``python -I -S _launch.py CONFIG``, inside the
bubblewrap namespaces (or, in the opted-in ``unsafe`` mode, in a throw-away directory).
It sets the resource limits in its own single-threaded process, moves the result
channel to fd 3, closes every other inherited descriptor, then ``execve``\\ s the
interpreter on the untrusted program, which so starts already confined. Never imported.

CONFIG is one JSON object: ``python``, ``program`` (its path as the program sees it),
``channel`` (the fd of the result channel), ``started`` (an fd it marks before anything
else, so the parent can tell a sandbox that failed to start from a program that failed), ``cpu_seconds``, ``memory_mb``, ``file_mb``
and ``processes`` (the RLIMIT_NPROC value: 1 in the namespaces, where the sandbox's own
init counts as one and the program is the other, so it can neither fork nor start a
thread; 0 in unsafe mode, which stops an unprivileged user forking but not root).
"""

import json
import os
import resource
import sys

CHANNEL = 3


def _limit(cfg):
    cpu, memory, fsize = cfg["cpu_seconds"], cfg["memory_mb"] << 20, cfg["file_mb"] << 20
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_NPROC, (cfg["processes"], cfg["processes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main():
    cfg = json.loads(sys.argv[1])
    os.write(cfg["started"], b"1")  # closed below, before the program could write to it
    if cfg["channel"] != CHANNEL:
        os.dup2(cfg["channel"], CHANNEL)
    os.closerange(CHANNEL + 1, 1 << 16)
    _limit(cfg)
    os.execve(cfg["python"], [cfg["python"], "-I", "-B", cfg["program"]], {})


if __name__ == "__main__":
    main()
