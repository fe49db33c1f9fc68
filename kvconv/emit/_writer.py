"""The file write of the trace emitters, in a second thread beside the encoding."""

from __future__ import annotations


class BackgroundWriter:
    """``f.write`` in a second thread, so that encoding the next buffers overlaps writing these (numpy and the
    write both release the GIL). At most ``limit`` bytes wait, so memory stays bounded. The buffers handed over
    must not change afterwards. A write error is raised in the caller's thread, at its next write or at close.

        >>> import io
        >>> f = io.BytesIO()
        >>> with BackgroundWriter(f) as w:
        ...     w.write(b"a"); w.write(b"b")
        >>> f.getvalue()
        b'ab'
    """

    def __init__(self, f, limit: int = 32 << 20) -> None:
        import collections
        import threading

        self.f, self.limit = f, limit
        self.queue: collections.deque = collections.deque()
        self.waiting = 0  # bytes queued or being written
        self.error: BaseException | None = None
        self.closing = False
        self.cv = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="kvconv-writer", daemon=True)
        self.thread.start()

    def write(self, b) -> None:
        n = memoryview(b).nbytes
        with self.cv:
            while self.waiting > self.limit and self.error is None:
                self.cv.wait()
            if self.error is not None:
                raise self.error
            self.queue.append((b, n))
            self.waiting += n
            self.cv.notify_all()

    def _run(self) -> None:
        while True:
            with self.cv:
                while not self.queue and not self.closing:
                    self.cv.wait()
                if not self.queue:
                    return
                b, n = self.queue.popleft()
            try:
                self.f.write(b)
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                with self.cv:
                    self.error = e
                    self.queue.clear()
                    self.cv.notify_all()
                return
            with self.cv:
                self.waiting -= n
                self.cv.notify_all()

    def close(self) -> None:
        """Wait until everything is written; raise the write error, if any."""
        with self.cv:
            self.closing = True
            self.cv.notify_all()
        self.thread.join()
        if self.error is not None:
            raise self.error

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.close()
            return
        with self.cv:  # the caller failed: drop what waits, let the thread end
            self.queue.clear()
            self.closing = True
            self.cv.notify_all()
        self.thread.join()


_FALLOC_FL_KEEP_SIZE = 1
RESERVE_FROM = 16 << 20  # outputs at least this large (estimated) have their blocks reserved


def reserve(fd: int, nbytes: int) -> bool:
    """Reserve ``nbytes`` of disk for the empty file ``fd`` before it is written (Linux fallocate with
    FALLOC_FL_KEEP_SIZE: its size stays 0, writes from byte 0 on fill the reserved blocks): ext4 then writes into
    allocated extents instead of allocating as it goes, and the page-cache copy costs less (68 MiB in 512 KiB
    writes: 19-20 -> 14-15 ms on the development machine). False where it cannot be done (no glibc, a pipe, a file
    system without it): nothing changes then. :func:`release_reserve` gives back what the writes did not fill."""
    from kvconv.memory import _glibc

    fallocate = _glibc("fallocate")
    if fallocate is None or nbytes <= 0:
        return False
    import ctypes

    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return fallocate(fd, _FALLOC_FL_KEEP_SIZE, 0, int(nbytes)) == 0


def release_reserve(fd: int) -> None:
    """The blocks :func:`reserve` set aside past the file's end, given back (the file keeps its size)."""
    import os

    os.ftruncate(fd, os.fstat(fd).st_size)
