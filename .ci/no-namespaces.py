"""Run a command where no namespace can be made, as in a container under Docker's default
seccomp profile without CAP_SYS_ADMIN (Kubernetes' RuntimeDefault is the same): clone and
unshare with any CLONE_NEW* flag fail EPERM, setns fails EPERM, clone3 fails ENOSYS (so that
glibc falls back to clone, whose flags a filter can read). bubblewrap then cannot start,
root or not (as root without user namespaces it makes the others directly: refused too).

The filter is inherited by every process the command starts, across exec.
Usage: python3 no-namespaces.py COMMAND [ARG...]   (execs COMMAND; x86_64 and aarch64)
Used by .ci/container.sh (the instance whose user namespaces are forbidden) and by
tests/backends/test_backends_external.py. Standard library only: it runs in the CI image.
"""
import ctypes
import errno
import os
import platform
import struct
import sys

ARCHES = {  # machine: (AUDIT_ARCH_*, clone, unshare, setns, clone3)
    "x86_64": (0xC000003E, 56, 272, 308, 435),
    "aarch64": (0xC00000B7, 220, 97, 268, 435),
}
NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET (Docker's mask)
LD_W_ABS, JEQ, JSET, RET = 0x20, 0x15, 0x45, 0x06
ALLOW = 0x7FFF0000
ERRNO = 0x00050000


def program() -> bytes:
    arch, clone, unshare, setns, clone3 = ARCHES[platform.machine()]
    ops = [
        (LD_W_ABS, 0, 0, 4),          # 0: arch
        (JEQ, 1, 0, arch),            # 1: ours: go on; else allow (never reached on these arches)
        (RET, 0, 0, ALLOW),           # 2
        (LD_W_ABS, 0, 0, 0),          # 3: the syscall's number
        (JEQ, 6, 0, clone3),          # 4: -> 11
        (JEQ, 6, 0, setns),           # 5: -> 12
        (JEQ, 2, 0, clone),           # 6: -> 9
        (JEQ, 1, 0, unshare),         # 7: -> 9
        (RET, 0, 0, ALLOW),           # 8
        (LD_W_ABS, 0, 0, 16),         # 9: args[0], its low 32 bits (the flags)
        (JSET, 1, 2, NAMESPACE_FLAGS),  # 10: a namespace flag -> 12, else -> 13
        (RET, 0, 0, ERRNO | errno.ENOSYS),  # 11
        (RET, 0, 0, ERRNO | errno.EPERM),   # 12
        (RET, 0, 0, ALLOW),           # 13
    ]
    return b"".join(struct.pack("HBBI", *op) for op in ops)


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    libc = ctypes.CDLL(None, use_errno=True)
    code = program()
    buf = ctypes.create_string_buffer(code)

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Prog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")
    os.execvp(sys.argv[1], sys.argv[1:])
    return 127


if __name__ == "__main__":
    sys.exit(main())
