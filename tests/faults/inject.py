"""
Fault injection into a running server process: C{strace} makes chosen
system calls on chosen journal files fail, for as long as it stays attached.

C{strace -f -p PID -P FILE -e inject=write:error=EIO:when=1+} attaches to
every thread of the server and answers each matching call on C{FILE} (the
path its file descriptor resolves to) with the error, without running it;
calls on other files run as usual. Detaching (SIGINT) ends the fault at once.
The full disk (a small tmpfs, filled and freed) lives in
L{tests.chaos.harness} (C{tmpfs}, C{fill_disk}).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

#: How long attaching may take (a loaded server stops every thread in turn).
ATTACH_SECONDS = 10.0


class Strace:
    """
    One C{strace} attached to a process, failing C{syscalls} on C{paths} with C{error}.

    Use it as a context manager: the fault starts once C{strace} reports that
    it attached, and ends when the block ends. L{injected} then counts the
    calls it failed (0 means the fault never hit: the scenario proves nothing).
    """

    def __init__(self, pid: int, paths: Iterable[Path], syscalls: Iterable[str] = ("write",),
                 error: str = "EIO", log: Path | None = None) -> None:
        self.pid = pid
        self.paths = [str(p) for p in paths]
        self.syscalls = tuple(syscalls)
        self.error = error
        self.log = log or Path(f"/tmp/kestrel-strace-{os.getpid()}-{pid}.log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.injected = 0
        #: C{time.monotonic()} when the fault began and ended.
        self.started = 0.0
        self.ended = 0.0

    def command(self) -> list[str]:
        """The C{strace} command line."""
        calls = ",".join(self.syscalls)
        paths = [arg for p in self.paths for arg in ("-P", p)]
        return ["strace", "-f", "-qq", "-o", str(self.log), "-p", str(self.pid), *paths,
                "-e", f"trace={calls}", "-e", f"inject={calls}:error={self.error}:when=1+"]

    def __enter__(self) -> Strace:
        self.log.unlink(missing_ok=True)
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + ATTACH_SECONDS
        # strace -o writes nothing until a call is traced; /proc tells when it traces.
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"strace exited with {self.proc.returncode}: {err.strip()}")
            if _traced_by(self.pid) == self.proc.pid:
                break
            time.sleep(0.01)
        else:
            self._detach()
            raise RuntimeError(f"strace did not attach to {self.pid} in {ATTACH_SECONDS}s")
        time.sleep(0.05)  # (strace attaches the other threads right after the first)
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self._detach()

    def _detach(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(ATTACH_SECONDS)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.ended = time.monotonic()
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        if self.log.exists():
            self.injected = self.log.read_text(errors="replace").count("(INJECTED)")
            self.log.unlink()


def _traced_by(pid: int) -> int:
    """The C{TracerPid} of C{pid} (0: not traced)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def ptrace_unavailable() -> str | None:
    """Why C{strace} cannot inject faults into another process here, or C{None}."""
    if shutil.which("strace") is None:
        return "no strace command (apt-get install strace)"
    victim = subprocess.Popen(["sleep", "30"])
    probe = Path(f"/tmp/kestrel-strace-probe-{os.getpid()}.out")
    try:
        with Strace(victim.pid, [probe], ("write",), "EIO", log=probe):
            pass
    except RuntimeError as e:
        return f"strace cannot attach and inject (ptrace not allowed?): {e}"
    finally:
        victim.kill()
        victim.wait()
    return None
