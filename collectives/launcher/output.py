"""The launcher's output pump: every rank's stdout and stderr copied to ours, one
prefixed line at a time (``[rank]<stdout>:``), a redrawn progress bar as it is drawn.

Kept apart from cli.py (the launcher proper) for size; the elastic driver uses it too.
"""
from __future__ import annotations

import os
import selectors
import sys
from typing import IO


class OutputPump:
    """Copies every rank's stdout/stderr to ours, one prefixed line at a time.

    A line ends at "\n" or "\r". A whole line is written at once, so lines of
    different ranks never interleave. After a "\r" (a progress bar such as
    tqdm's redraws its line as "\r text" with no end), the text that follows is
    forwarded as it comes, prefixed once, so the bar moves instead of waiting
    for the newline at its end.
    """

    def __init__(self, sel: selectors.BaseSelector) -> None:
        self.sel = sel
        self.partial: dict[int, bytearray] = {}
        # per fd: [the next byte starts a line (needs the prefix), the last line end was "\r"]
        self.state: dict[int, list] = {}
        self.open = 0

    def add(self, rank: int, stream: str, pipe: IO[bytes]) -> None:
        os.set_blocking(pipe.fileno(), False)
        self.sel.register(pipe, selectors.EVENT_READ, (rank, stream))
        self.partial[pipe.fileno()] = bytearray()
        self.state[pipe.fileno()] = [True, False]
        self.open += 1

    @staticmethod
    def _emit(rank: int, stream: str, line: bytes, prefix: bool = True) -> None:
        out = sys.stdout if stream == "stdout" else sys.stderr
        data = (b"[%d]<%s>:" % (rank, stream.encode()) if prefix else b"") + line
        raw = getattr(out, "buffer", None)
        if raw is None:  # a text-only stream (e.g. replaced in tests)
            out.write(data.decode("utf-8", "replace"))
            out.flush()
            return
        out.flush()  # anything we wrote through the text layer goes first
        raw.write(data)  # one write per line: lines never interleave
        raw.flush()

    def _pump(self, rank: int, stream: str, fd: int, buf: bytearray) -> None:
        """Write every ended line of buf, and after a "\r" the unended rest too."""
        state = self.state[fd]
        while buf:
            ends = [i for i in (buf.find(b"\n"), buf.find(b"\r")) if i >= 0]
            if not ends:
                break
            end = min(ends) + 1
            piece = bytes(buf[:end])
            del buf[:end]
            if piece == b"\n" and state[1]:  # the "\n" of a "\r\n": ends the same line
                self._emit(rank, stream, piece, prefix=False)
            elif piece == b"\r" and state[0]:  # a redraw's leading "\r": already at a line start
                pass
            else:
                self._emit(rank, stream, piece, prefix=state[0])
            state[0], state[1] = True, piece.endswith(b"\r")
        if buf and state[1]:  # a progress line being redrawn: forward it now
            self._emit(rank, stream, bytes(buf), prefix=state[0])
            state[0] = False
            buf.clear()

    def _finish(self, rank: int, stream: str, fd: int) -> None:
        """EOF: end a last line that has no line end."""
        buf = self.partial.pop(fd, bytearray())
        state = self.state.pop(fd, [True, False])
        if buf:
            self._emit(rank, stream, bytes(buf) + b"\n", prefix=state[0])
        elif not state[0]:
            self._emit(rank, stream, b"\n", prefix=False)

    def read(self, key: selectors.SelectorKey) -> None:
        rank, stream = key.data
        fd = key.fd
        try:
            chunk = os.read(fd, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:  # EOF
            self._finish(rank, stream, fd)
            self.sel.unregister(key.fileobj)
            key.fileobj.close()
            self.open -= 1
            return
        buf = self.partial[fd]
        buf += chunk
        self._pump(rank, stream, fd, buf)

    def close_all(self) -> None:
        for key in list(self.sel.get_map().values()):
            if isinstance(key.data, tuple):
                self.read_remaining(key)

    def read_remaining(self, key: selectors.SelectorKey) -> None:
        rank, stream = key.data
        self._finish(rank, stream, key.fd)
        self.sel.unregister(key.fileobj)
        key.fileobj.close()
        self.open -= 1
