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

from grpo_launch.contracts.secrets import redact

# A process's output is read and shown in pieces of this size, yielding to the event loop after each: a read of
# output already buffered returns without yielding, so a process printing 1 MiB at once (about 2 s of console printing
# here) held the loop past the other servers' liveness bound, and a healthy one was declared dead.
READ_CHUNK = 1 << 12
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
    """Bytes into lines, each as (its text without the newline, whether the newline ended it); a line longer than
    `LINE_LIMIT` comes in pieces, the last of which ends it."""

    def __init__(self) -> None:
        self.pending = b""

    def feed(self, data: bytes) -> list[tuple[str, bool]]:
        *complete, self.pending = (self.pending + data).split(b"\n")
        out = [piece for line in complete for piece in _pieces(line, ends=True)]
        while len(self.pending) > LINE_LIMIT:
            out.append((_text(self.pending[:LINE_LIMIT]), False))
            self.pending = self.pending[LINE_LIMIT:]
        return out

    def end(self) -> list[tuple[str, bool]]:
        rest, self.pending = self.pending, b""
        return [(_text(rest), False)] if rest else []


def _pieces(line: bytes, *, ends: bool) -> list[tuple[str, bool]]:
    chunks = [line[i:i + LINE_LIMIT] for i in range(0, len(line), LINE_LIMIT)] or [line]
    return [(_text(c), ends and i == len(chunks) - 1) for i, c in enumerate(chunks)]


def _text(line: bytes) -> str:
    return line.decode(errors="replace")


async def drain(stream: asyncio.StreamReader, log: LogFile, on_line: Callable[[str], None],
                warn: Callable[[str], None], secrets: tuple[str, ...] = ()) -> None:
    """Read `stream` to its end into `log`, each line to `on_line`, with every value of `secrets` replaced (in each
    piece of a line: a value cut by a piece's end is not seen); neither a failing log nor a raising observer stops
    it."""
    lines = Lines()
    failed = False

    def observe(pieces: list[tuple[str, bool]]) -> None:
        nonlocal failed
        for text, ends in pieces:
            text = redact(text, secrets)
            log.write((text + "\n" if ends else text).encode())
            try:
                on_line(text)
            except Exception as e:  # noqa: BLE001  (a bug of ours must not block the child on a full pipe)
                if not failed:
                    failed = True
                    warn(f"showing {log.path.name}'s lines failed ({type(e).__name__}: {e}); the log keeps them")

    try:
        while chunk := await stream.read(READ_CHUNK):
            observe(lines.feed(chunk))
            await asyncio.sleep(0)  # see READ_CHUNK
        observe(lines.end())
    except OSError as e:  # the pipe itself failed: nothing more can be read from it
        warn(f"reading {log.path.name}'s output failed: {e}")
    finally:
        log.close()
