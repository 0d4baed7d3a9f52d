"""Progress of long work: a tqdm bar on a terminal, plain lines with --log, else nothing.

    with Progress("autoclust bench", total=len(cases), unit="case", delay=0) as bar:
        for case in cases:
            bar.write(run(case))        # a result line, printed above the bar
            bar.update(detail=case)

On a terminal (the stream's isatty()) a tqdm bar appears once the work has taken `delay`
seconds (DELAY_S by default, so quick work stays silent). Elsewhere (a pipe, a log file,
pytest) nothing is printed unless `log` is set; then a plain line at most every
LINE_EVERY_S seconds and one at the end. tqdm is imported only when a bar is drawn.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from typing_extensions import Self

DELAY_S = 1.0  # a bar appears only once the work has taken this long
LINE_EVERY_S = 5.0  # plain-line mode: at most one line per this many seconds
TICK_S = 0.5  # a shown bar is redrawn this often, so its clock moves during a long item
# tqdm's bar without its rate (items per second means little for a few slow items);
# the postfix names the item in progress.
_FORMAT = {False: "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {unit}s "
                  "[{elapsed}<{remaining}{postfix}]",
           True: "{desc}: {n_fmt} {unit}s [{elapsed}{postfix}]"}


def is_tty(stream: Any) -> bool:
    """Whether `stream` is an interactive terminal (False for pipes, files, closed streams)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class Progress:
    """One task's progress: `update()` per finished item, `write()` for messages, `close()`."""

    def __init__(self, desc: str, total: int | None = None, unit: str = "it",
                 log: bool = False, stream: TextIO | None = None, delay: float | None = None,
                 leave: bool = True):
        self.desc = desc
        self.total = total
        self.unit = unit
        self.count = 0
        self.stream = sys.stderr if stream is None else stream
        self.t0 = time.monotonic()
        self._last_line = self.t0
        self._lock = threading.Lock()
        self._bar: Any = None
        self._lines = False
        self._closed = threading.Event()
        if is_tty(self.stream):
            from tqdm import tqdm
            delay = DELAY_S if delay is None else delay
            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, delay=delay,
                             leave=leave, dynamic_ncols=True, bar_format=_FORMAT[total is None])
            # tqdm draws only on update(); this ticker shows the bar (and its clock) while one
            # long item, such as one big cluster's compile, is still running.
            threading.Thread(target=self._tick, args=(delay,), daemon=True,
                             name="autoclust-progress").start()
        else:
            self._lines = log

    @property
    def mode(self) -> str:
        """"bar", "lines" or "off"."""
        return "bar" if self._bar is not None else "lines" if self._lines else "off"

    def _tick(self, delay: float) -> None:
        wait = delay
        while not self._closed.wait(wait):
            with self._lock:
                if self._bar is not None:
                    self._bar.refresh()
            wait = TICK_S

    def start(self, detail: str) -> None:
        """An item starts (shown beside the bar, e.g. the cluster being compiled)."""
        if self._bar is not None:
            with self._lock:
                self._bar.set_postfix_str(detail, refresh=False)

    def update(self, n: int = 1, detail: str = "") -> None:
        """`n` more items done; `detail` (e.g. the item's name) is shown beside the bar."""
        with self._lock:
            self.count += n
            if self._bar is not None:
                if detail:
                    self._bar.set_postfix_str(detail, refresh=False)
                self._bar.update(n)
            elif self._lines and time.monotonic() - self._last_line >= LINE_EVERY_S:
                self._print_line()

    def write(self, message: str, stream: TextIO | None = None) -> None:
        """Print a line to `stream` (default: the bar's), above the bar on a terminal."""
        stream = self.stream if stream is None else stream
        with self._lock:
            if self._bar is not None:
                self._bar.write(message, file=stream)
            else:
                print(message, file=stream, flush=True)

    def close(self) -> None:
        """Remove (or keep, with leave=True) the bar; in line mode print the final count."""
        self._closed.set()
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            elif self._lines:
                self._print_line()
                self._lines = False

    def _print_line(self) -> None:
        self._last_line = time.monotonic()
        from autoclust.text import plural
        done = plural(self.count, self.unit)
        if self.total is not None:
            done = f"{self.count}/{plural(self.total, self.unit)}"
        print(f"{self.desc}: {done}, {self._last_line - self.t0:.1f} s",
              file=self.stream, flush=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
