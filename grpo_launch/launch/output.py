"""A child's output, drained until it ends whatever else fails.

A child that writes into a pipe nobody reads blocks once the pipe is full, and its exit never comes. So the
draining of a child's output stops only at the pipe's end: a line of any length (a tqdm bar redrawn with `\\r` for a
whole epoch has no newline) is passed on in pieces of at most `LINE_LIMIT` bytes while the log keeps it whole; a log
write that fails (a full disk, a file size limit) loses that output only, and the loss is said once when it starts
and once when writing works again; an observer of the lines that raises (the console) is told once and the lines
keep coming.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

READ_CHUNK = 1 << 16
LINE_LIMIT = 1 << 16            # longer lines reach the observers in pieces of this many bytes


class LogFile:
    """A process's log, appended to. A write that fails loses what it held and nothing else."""

    def __init__(self, path: Path, warn: Callable[[str], None]) -> None:
        self.path = path
        self.warn = warn
        self.lost = 0           # bytes lost since writing last worked
        self.fd: int | None = None
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            self._failed(e, 0)

    def write(self, data: bytes) -> None:
        if self.fd is None:
            self.lost += len(data)
            return
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except OSError as e:
            self._failed(e, len(view))
            return
        if self.lost:
            self.warn(f"{self.path}: writing works again ({self.lost} bytes of output were lost)")
            self.lost = 0

    def _failed(self, error: OSError, size: int) -> None:
        if not self.lost:
            self.warn(f"{self.path}: {error.strerror or error} (errno {error.errno}): this output is not kept until "
                      f"a write works again; the process goes on")
        self.lost += size or 1

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Lines:
    """Bytes into lines (without their newline), a line longer than `LINE_LIMIT` in pieces."""

    def __init__(self) -> None:
        self.pending = b""

    def feed(self, data: bytes) -> list[str]:
        *complete, self.pending = (self.pending + data).split(b"\n")
        while len(self.pending) > LINE_LIMIT:
            complete.append(self.pending[:LINE_LIMIT])
            self.pending = self.pending[LINE_LIMIT:]
        return [_text(c) for piece in complete for c in _pieces(piece)]

    def end(self) -> list[str]:
        rest, self.pending = self.pending, b""
        return [_text(rest)] if rest else []


def _pieces(line: bytes) -> list[bytes]:
    return [line[i:i + LINE_LIMIT] for i in range(0, len(line), LINE_LIMIT)] or [line]


def _text(line: bytes) -> str:
    return line.decode(errors="replace")


async def drain(stream: asyncio.StreamReader, log: LogFile, on_line: Callable[[str], None],
                warn: Callable[[str], None]) -> None:
    """Read `stream` to its end into `log`, each line to `on_line`; neither a failing log nor a raising observer
    stops it."""
    lines = Lines()
    failed = False

    def observe(texts: list[str]) -> None:
        nonlocal failed
        for text in texts:
            try:
                on_line(text)
            except Exception as e:  # noqa: BLE001  (a bug of ours must not block the child on a full pipe)
                if not failed:
                    failed = True
                    warn(f"showing {log.path.name}'s lines failed ({type(e).__name__}: {e}); the log keeps them")

    try:
        while chunk := await stream.read(READ_CHUNK):
            log.write(chunk)
            observe(lines.feed(chunk))
        observe(lines.end())
    except OSError as e:  # the pipe itself failed: nothing more can be read from it
        warn(f"reading {log.path.name}'s output failed: {e}")
    finally:
        log.close()
