"""A followed job's output as the user sees it: srun's `--label` says which task a line
came from, so each becomes `[node rankN] text` (torchrun's workers through
vmrun.runs.lines, which also joins their pieces); the batch script's `\\x1dvmrun ...` lines
are events (an attempt began, the job was requeued, its state changed), not output."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

from vmrun.reporting import Reporter
from vmrun.runs.lines import Prefixer, is_c10d_noise

OnEvent = Callable[[str, str], None]
MARK = b"\x1dvmrun "
_LABEL = re.compile(rb"^ *(\d+): ")


class Lines:
    """Bytes from the login node in pieces, as whole lines to `_line` (a feeder thread and
    the final flush share it)."""

    def __init__(self) -> None:
        self.rest = b""
        self.lock = threading.Lock()

    def feed(self, data: bytes) -> None:
        with self.lock:
            *lines, self.rest = (self.rest + data).split(b"\n")
            for line in lines:
                self._line(line)

    def flush(self) -> None:
        with self.lock:
            if self.rest:
                self._line(self.rest)
                self.rest = b""
            self._flushed()

    def _line(self, line: bytes) -> None:
        raise NotImplementedError

    def _flushed(self) -> None:
        """After the last line."""


class JobStream(Lines):
    def __init__(
        self,
        out: Reporter,
        on_event: OnEvent,
        *,
        launcher: str,
        tasks_per_node: int,
        verbose: bool = False,
    ):
        super().__init__()
        self.out = out
        self.on_event = on_event
        self.launcher = launcher
        self.tasks_per_node = max(1, tasks_per_node)
        self.verbose = verbose
        self.nodes: list[str] = []
        self.prefixers: dict[int, Prefixer] = {}

    def _flushed(self) -> None:
        self._flush_prefixers()

    def _flush_prefixers(self) -> None:
        for prefixer in self.prefixers.values():
            prefixer.flush()
        self.prefixers.clear()

    def _line(self, line: bytes) -> None:
        if line.startswith(MARK):
            word, _, rest = line[len(MARK) :].decode("utf-8", "replace").partition(" ")
            if word == "attempt":
                self._flush_prefixers()
                self.nodes = rest.split(" nodes ", 1)[1].split() if " nodes " in rest else []
            self.on_event(word, rest)
            return
        label = _LABEL.match(line)
        if label is None:  # the batch script's own output (srun's errors, module load)
            if self.verbose or not is_c10d_noise(line):
                self.out.output(line + b"\n")
            return
        task, text = int(label.group(1)), line[label.end() :]
        if self.launcher == "torchrun":
            prefixer = self.prefixers.get(task)
            if prefixer is None:
                host = self._node(task) if len(self.nodes) > 1 else None
                prefixer = self.prefixers[task] = Prefixer(host, self.out, verbose=self.verbose)
            prefixer.feed(text + b"\n")
            return
        if not self.verbose and is_c10d_noise(text):
            return
        node = self._node(task // self.tasks_per_node)
        many = len(self.nodes) > 1
        if self.launcher == "env":
            head = f"[{node} rank{task}] " if many else f"[rank{task}] "
        else:
            head = f"[{node}] " if many else ""
        self.out.output(head.encode() + text + b"\n")

    def _node(self, index: int) -> str:
        return self.nodes[index] if 0 <= index < len(self.nodes) else f"node{index}"
