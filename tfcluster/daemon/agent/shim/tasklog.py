"""A task's output on disk: written by its shim, read back for `tfcluster logs`, summed for the hang watchdog.

An attempt keeps at most a limit of output (launch setting, the agent's --max-task-log). Up to the limit the
output is the bytes exactly as written. Past it the head (the first quarter of the limit: how the task
started) stays in the output file, the newest bytes stay in tail segments (the other three quarters), and
the middle is dropped a segment at a time, oldest first. Each segment is named after the offset of its first
byte in the whole output (layout.output_tail_name), so the names alone say how much was dropped and where:
a reader sends one marker line in place of the missing bytes. Files end at a line break when one comes soon
after their size is reached, so the marker usually sits between whole lines.

Standard library only: the shim imports this.
"""

from __future__ import annotations

import codecs
import collections
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tfcluster import layout

# 256 MiB per attempt keeps the whole output of an ordinary training run (a Keras progress line per step is
# about 150 bytes: a million steps fit), while a task stuck printing in a loop stops at this instead of
# filling the disk; with the default --retain-bytes of 50G, two hundred such attempts fit.
DEFAULT_LIMIT_BYTES = 256 << 20
MIN_LIMIT_BYTES = 64 << 10
HEAD_SHARE = 4        # the head is a quarter of the limit
TAIL_SEGMENTS = 4     # the rest, in this many segments: 9/16 to 3/4 of the limit of newest output is kept
LINE_SLACK_BYTES = 64 << 10  # how far past its size a file may go to end at a line break
SCAN_BLOCK_BYTES = 64 << 10
OUTPUT_MODE = 0o640   # the agent writes, the job's group reads
MAX_LINE_CHARS = 4096  # of a line in the last-lines view (the coordinator keeps no more of a line)
_TERMINAL_CONTROLS = re.compile(r"([\r\n\b])")


def dropped_marker(count: int) -> bytes:
    return f"[tfcluster: {count} bytes of output dropped here]\n".encode()


class OutputWriter:
    """Writes a task's output into its attempt dir within the limit (the head, then rotating tail segments)."""

    def __init__(self, directory: Path, limit: int = DEFAULT_LIMIT_BYTES, group: int = -1):
        limit = max(limit, MIN_LIMIT_BYTES)
        self.dir = directory
        self.group = group  # the job's group: the job reads its own output, nobody else does
        self.head_bytes = limit // HEAD_SHARE
        self.segment_bytes = (limit - self.head_bytes) // TAIL_SEGMENTS
        self.slack = min(LINE_SLACK_BYTES, self.segment_bytes // 4)
        self.file: BinaryIO = self._open(directory / layout.OUTPUT_FILE)
        self.size = self.total = self.file.tell()  # bytes in the current file; bytes written in all
        self.file_bytes = self.head_bytes          # how big the current file may grow (then the next one starts)
        self.at_line_start = True
        self.segments: collections.deque[int] = collections.deque()  # offsets of the tail segments kept

    def write(self, data: bytes) -> None:
        while data:
            take = self._room(data)
            if not take:
                self._next_segment()
                continue
            self.file.write(data[:take])
            self.size, self.total = self.size + take, self.total + take
            self.at_line_start = data[take - 1:take] == b"\n"
            data = data[take:]

    def close(self) -> None:
        self.file.close()

    def _open(self, path: Path) -> BinaryIO:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, OUTPUT_MODE)
        if self.group != -1:
            os.fchown(fd, -1, self.group)
        return open(fd, "ab", buffering=0)

    def _room(self, data: bytes) -> int:
        """How much of data goes into the current file: up to its size, then on to the end of the line under
        way unless that runs past the slack."""
        if self.size < self.file_bytes:
            return min(len(data), self.file_bytes - self.size)
        if self.at_line_start or self.size >= self.file_bytes + self.slack:
            return 0
        window = data[:self.file_bytes + self.slack - self.size]
        end = window.find(b"\n")
        return end + 1 if end >= 0 else len(window)

    def _next_segment(self) -> None:
        # The new segment exists before the oldest goes, so a reader always finds where the output went on.
        self.file.close()
        self.file = self._open(self.dir / layout.output_tail_name(self.total))
        self.segments.append(self.total)
        self.size, self.file_bytes = 0, self.segment_bytes
        while len(self.segments) > TAIL_SEGMENTS:
            (self.dir / layout.output_tail_name(self.segments.popleft())).unlink(missing_ok=True)


@dataclass(frozen=True)
class Piece:
    """One file of an attempt's output and the offset of its first byte in the whole output."""
    path: Path
    offset: int


def pieces(directory: Path) -> list[Piece]:
    """The files of an attempt's output in order: the head, then the tail segments still kept."""
    try:
        names = os.listdir(directory)
    except OSError:
        names = []
    offsets = sorted(o for o in map(layout.output_tail_offset, names) if o is not None)
    return [Piece(directory / layout.OUTPUT_FILE, 0)] + \
        [Piece(directory / layout.output_tail_name(o), o) for o in offsets]


def total_bytes(directory: Path) -> int:
    """Everything the task has written so far, dropped bytes included: it keeps growing while the task prints,
    which is what the hang watchdog watches."""
    last = pieces(directory)[-1]
    try:
        return last.offset + last.path.stat().st_size
    except OSError:
        return last.offset


def tail_position(directory: Path, lines: int) -> int:
    """The offset in the whole output where its last `lines` lines start (0: it has fewer)."""
    found, last_byte = 0, None
    for piece in reversed(pieces(directory)):
        try:
            f = open(piece.path, "rb")
        except OSError:
            continue
        with f:
            end = f.seek(0, os.SEEK_END)
            if last_byte is None:
                last_byte = piece.offset + end - 1
            for at in _line_breaks_backwards(f, end):
                if piece.offset + at == last_byte:  # the output's final line break ends a line, starts none
                    continue
                found += 1
                if found == lines:
                    return piece.offset + at + 1
    return 0


def _line_breaks_backwards(f: BinaryIO, end: int):
    pos = end
    while pos > 0:
        step = min(SCAN_BLOCK_BYTES, pos)
        pos -= step
        f.seek(pos)
        chunk = f.read(step)
        i = len(chunk)
        while (i := chunk.rfind(b"\n", 0, i)) >= 0:
            yield pos + i


class OutputReader:
    """Reads an attempt's output from an offset on, across its files as the shim writes and rotates them; where
    bytes were dropped it returns one marker line instead."""

    def __init__(self, directory: Path, position: int = 0):
        self.dir = directory
        self.position = position  # offset in the whole output of the next byte to return
        self.piece: Piece | None = None
        self.file: BinaryIO | None = None
        self.at_line_start = True

    def read(self, size: int) -> bytes:
        """The next bytes, or b"" when there is nothing more yet (follow mode asks again later)."""
        while True:
            if self.file is None and not self._open():
                return b""
            if self.piece.offset > self.position:  # the bytes before this file were dropped
                return self._gap(self.piece.offset)
            data = self.file.read(size)
            if not data:
                later = [p for p in pieces(self.dir) if p.offset > self.piece.offset]
                if not later:
                    return b""
                data = self.file.read(size)  # complete now that a later file exists: its rest comes first
                if not data:
                    self.file.close()
                    self.piece, self.file = later[0], None
                    continue
            self.position += len(data)
            self.at_line_start = data.endswith(b"\n")
            return data

    def close(self) -> None:
        if self.file is not None:
            self.file.close()

    def _gap(self, resume_at: int) -> bytes:
        dropped, self.position = resume_at - self.position, resume_at
        marker = dropped_marker(dropped)
        return marker if self.at_line_start else b"\n" + marker

    def _open(self) -> bool:
        """Opens the file that holds the position or, when that one was dropped, the next one kept."""
        while True:
            if self.piece is None:
                self.piece = [p for p in pieces(self.dir) if p.offset <= self.position][-1]
            try:
                self.file = open(self.piece.path, "rb")
            except FileNotFoundError:
                later = [p for p in pieces(self.dir) if p.offset > self.piece.offset > 0]
                if not later:  # nothing written yet (or the attempt's files are gone)
                    self.piece = None
                    return False
                self.piece = later[0]
                continue
            self.file.seek(max(0, self.position - self.piece.offset))
            return True


class LastLines:
    """The last lines of the output as a terminal shows them, for the status view: a carriage return goes back
    to the start of the line and what follows overwrites it, a backspace steps back one column, so a progress
    bar redrawn a thousand times is one line in its final state."""

    def __init__(self, count: int):
        self.lines: collections.deque[str] = collections.deque(maxlen=count)
        self.line = ""
        self.column = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> None:
        for token in _TERMINAL_CONTROLS.split(self.decoder.decode(data)):
            if token == "\n":
                self.lines.append(self.line.rstrip())
                self.line, self.column = "", 0
            elif token == "\r":
                self.column = 0
            elif token == "\b":
                self.column = max(0, self.column - 1)
            elif token and self.column < MAX_LINE_CHARS:
                token = token[:MAX_LINE_CHARS - self.column]
                end = self.column + len(token)
                self.line = self.line[:self.column] + token + self.line[end:]
                self.column = end

    def tail(self) -> list[str]:
        """The last lines, the one still being written included."""
        partial = self.line.rstrip()
        return [*self.lines, partial][-self.lines.maxlen:] if partial else list(self.lines)
