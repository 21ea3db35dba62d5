"""One fault injector for the loop-survival and full-disk tests: a callable that raises
for its first few calls, then calls through."""
import errno


def enospc():
    return OSError(errno.ENOSPC, "No space left on device")


def injected_bug():
    return RuntimeError("injected bug")


class Faulty:
    """Wraps a callable: raises `error()` on the first `times` calls, then calls through."""

    def __init__(self, real, times, error=enospc):
        self.real, self.left, self.error, self.calls = real, times, error, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.left > 0:
            self.left -= 1
            raise self.error()
        return self.real(*args, **kwargs)
