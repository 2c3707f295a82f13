"""Sandbox launcher: run by a fresh ``python -I -S`` from :mod:`stages.filter.sandbox`.

It sets up the isolation in its own single-threaded process (never in a ``preexec_fn``
of the multi-threaded trainer process), then ``execve``\\ s the interpreter on the
untrusted program, so the program starts already confined. Standard library only.

Argument: one JSON object with ``mode`` ("jail" or "rlimits"), ``program`` (host path of
the program file), ``work`` (host work directory, rlimits mode), ``root`` (an empty host
directory to build the jail on, jail mode), ``python``, ``prefix`` (the interpreter's
install prefix), ``uid`` and the limits.

jail (root on Linux): new mount, network, IPC and UTS namespaces; an empty tmpfs as the
new root holding read-only binds of /usr (and the /bin, /lib links), the interpreter's
prefix and four device nodes, plus a writable /work and /tmp; ``chroot`` into it; rlimits;
a fresh unprivileged uid and gid with no supplementary groups; ``no_new_privs``.

rlimits (anyone): rlimits, the work directory as cwd, and the audit-hook prelude that
the parent prepends to the program (see sandbox.py) — a weaker, in-process guard.
"""

import ctypes
import json
import os
import resource
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWNET = 0x20000, 0x4000000, 0x8000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 32, 4096, 16384, 1 << 18)
PR_SET_NO_NEW_PRIVS = 38
DEVICES = ("null", "zero", "random", "urandom")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"sandbox setup: {what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None):
    enc = (lambda s: None if s is None else s.encode())
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags),
                       enc(data)), f"mount {source!r} on {target!r}")


def _bind_ro(source, target):
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    _mount(source, target, None, MS_BIND | MS_REC)
    _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID)


def _build_root(cfg, program):
    root = cfg["root"]
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['disk_mb']}m,mode=755")
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(top):
            os.symlink(os.readlink(top), root + top)
        elif os.path.isdir(top):
            _bind_ro(top, root + top)
    prefix = cfg["prefix"]
    if not prefix.startswith("/usr/"):
        _bind_ro(prefix, root + prefix)
    for name in DEVICES:
        _bind_ro(f"/dev/{name}", f"{root}/dev/{name}")
    for d in ("work", "tmp"):
        os.mkdir(f"{root}/{d}", 0o700)
        os.chown(f"{root}/{d}", cfg["uid"], cfg["uid"])
    with open(f"{root}/work/main.py", "wb") as f:
        f.write(program)
    os.chown(f"{root}/work/main.py", cfg["uid"], cfg["uid"])
    os.chroot(root)
    os.chdir("/work")


def _limit(cfg, processes):
    cpu = cfg["cpu_seconds"]
    memory, fsize = cfg["memory_mb"] << 20, cfg["file_mb"] << 20
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main():
    cfg = json.loads(sys.argv[1])
    with open(cfg["program"], "rb") as f:
        program = f.read()
    if cfg["mode"] == "jail":
        _build_root(cfg, program)
        _limit(cfg, 1)  # the fresh uid owns this one process: no fork, no thread
        uid = cfg["uid"]
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        main_py = "main.py"
    else:
        os.chdir(cfg["work"])
        _limit(cfg, 0)  # an unprivileged user may not fork at all (root ignores this)
        main_py = cfg["program"]
    os.execve(cfg["python"], [cfg["python"], "-I", "-B", main_py], {})


if __name__ == "__main__":
    main()
