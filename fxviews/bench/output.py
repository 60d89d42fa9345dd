"""What the bench prints besides its tables: a progress line, and PyTorch's warnings collected.

Two things used to land in the middle of a table. PyTorch's C++ warnings (vmap's
"BatchedFallback ... performance drop because we have not yet implemented the batching rule",
once per op, from threads Python's ``warnings`` never sees) are written straight to file
descriptor 2; :func:`collected_output` points that descriptor at a temporary file while a row
runs and Python warnings at a list, then :func:`summarize` says once, after the row's table,
what was silenced. And a row can run for minutes: :data:`progress` keeps one status line on
the terminal (which row, which case, seconds elapsed), redrawn every second and erased when
the row ends; it is drawn only where the original stderr is a terminal, so logs and pipes get
the tables alone.

Example::

    with collected_output() as collected, progress.row("8. models"):
        progress.step("resnet18, per-sample grads")
        table = bench(settings)
    print(render(table))
    for line in summarize(collected):
        print(line)
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TextIO

__all__ = ["Collected", "Progress", "collected_output", "progress", "summarize"]

#: vmap's notice that it runs an op one sample at a time: which op, from its message.
_NO_BATCHING_RULE = re.compile(r"not yet implemented the batching rule for ([\w:.]+)")
#: Lines of other warnings echoed after a row; the rest are counted.
_ECHOED = 5


@dataclass
class Collected:
    """What a row wrote to stderr (C++ warnings among it) and the Python warnings it raised."""

    stderr: str = ""
    warnings: list[str] = field(default_factory=list)


@contextlib.contextmanager
def collected_output() -> Iterator[Collected]:
    """Collect file descriptor 2 and Python warnings while the block runs (see the Note).

    Where descriptor 2 cannot be redirected (an embedding host without one), only Python
    warnings are collected.
    """
    collected = Collected()
    # The filters stay as they are: what they would show is collected, what they hide stays so.
    with warnings.catch_warnings(record=True) as caught, _descriptor_2_collected(collected):
        yield collected
    collected.warnings = [str(w.message) for w in caught]


@contextlib.contextmanager
def _descriptor_2_collected(collected: Collected) -> Iterator[None]:
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    sys.stderr.flush()
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        progress.terminal = terminal = _terminal(saved)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            progress.terminal = None
            if terminal is not None:
                terminal.close()
            sink.seek(0)
            collected.stderr = sink.read().decode("utf-8", "replace")


def _terminal(descriptor: int) -> TextIO | None:
    """A text stream on ``descriptor`` (a copy of stderr) if it is a terminal, else None."""
    if not os.isatty(descriptor):
        return None
    return os.fdopen(os.dup(descriptor), "w")


def summarize(collected: Collected) -> list[str]:
    """Lines saying once what ``collected`` silenced: vmap's per-sample fallbacks by op, and
    the first few lines of anything else (the rest counted).

    Example::

        >>> summarize(Collected(stderr="[W] ... the batching rule for aten::median ...\\n"))
        ['note: PyTorch warned 1 time that vmap runs ops without a batching rule one sample
        at a time (slower, not wrong): aten::median; silenced above']
    """
    lines = collected.stderr.splitlines() + collected.warnings
    fallbacks: Counter[str] = Counter()
    others: list[str] = []
    for line in lines:
        found = _NO_BATCHING_RULE.search(line)
        if found:
            fallbacks[found.group(1).rstrip(".")] += 1
        elif line.strip():
            others.append(line.rstrip())
    out = []
    if fallbacks:
        count = sum(fallbacks.values())
        out.append(
            f"note: PyTorch warned {count} time{'s' if count > 1 else ''} that vmap runs ops "
            "without a batching rule one sample at a time (slower, not wrong): "
            f"{', '.join(sorted(fallbacks))}; silenced above"
        )
    if others:
        distinct = Counter(others)  # in first-seen order, each once with its count
        out.append(f"note: {len(others)} other line(s) PyTorch or a library printed meanwhile:")
        out += [
            f"  {line}" + (f" (x{n})" if n > 1 else "")
            for line, n in list(distinct.items())[:_ECHOED]
        ]
        if len(distinct) > _ECHOED:
            out.append(f"  ... and {len(distinct) - _ECHOED} more distinct lines")
    return out


class Progress:
    """One status line on the terminal: the row, its current case, the seconds elapsed.

    Rows call :meth:`step` as they move from case to case; a background thread redraws the
    line every second so the elapsed time moves during a long case. Without a terminal
    (:attr:`terminal` None) every call is a no-op.
    """

    def __init__(self) -> None:
        self.terminal: TextIO | None = None
        self._row = ""
        self._case = ""
        self._started = 0.0
        self._stop = threading.Event()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def row(self, title: str) -> Iterator[None]:
        """Show ``title`` (up to its first colon) while the block runs; erase it after."""
        self._row, self._case, self._started = title.split(":")[0], "", time.perf_counter()
        self._stop.clear()
        ticker = threading.Thread(target=self._tick, daemon=True)
        ticker.start()
        try:
            yield
        finally:
            self._stop.set()
            ticker.join()
            self._draw(final=True)

    def step(self, case: str) -> None:
        """The row has moved on to ``case`` (e.g. ``"resnet18, per-sample grads"``)."""
        self._case = case
        self._draw()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            self._draw()

    def _draw(self, final: bool = False) -> None:
        terminal = self.terminal
        if terminal is None:
            return
        elapsed = time.perf_counter() - self._started
        case = f": {self._case}" if self._case else ""
        text = "" if final else f"[{self._row}{case}, {elapsed:.0f} s]"
        with self._lock:  # "\r" then erase to the end of the line: one line, redrawn
            terminal.write(f"\r\033[K{text[:99]}")
            terminal.flush()


#: The bench's one progress line.
progress = Progress()
