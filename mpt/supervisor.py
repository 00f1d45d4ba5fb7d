"""A training run's last word when its process dies of a signal: `python -m mpt.main`
trains in a child it watches, so that a segfault, the kernel's OOM killer or an abort
ends in summary.json and one line naming the death by what is known, with the child's
last error lines, not in a fault-handler dump or a guess.

A death is named by its evidence (`Death.named`): the kernel's OOM-kill counters (the
memory cgroup's and the host's, Linux >= 4.13) rising while the child ran, or its last
stderr lines saying so (std::bad_alloc, ResourceExhausted), is `oom` (exit 4); TF's
CPU-feature guard line ("compiled to use X instructions, but these aren't available")
names a TensorFlow built for another CPU; any other SIGSEGV/SIGABRT/SIGBUS is `failed`,
exit 5 (crashed), never "most likely out of memory". A SIGKILL with no OOM count came
from outside (a user, a scheduler) and ends `interrupted`, resumable; where no counter
is readable, a SIGKILL is taken for memory. A death after the run recorded itself
(its diagnosis) leaves summary.json as it was.

The parent imports no TensorFlow and does nothing else: the child gets the same
arguments, the terminal's stdout, its own process group (so that a stop signal reaches
it once, forwarded by the parent: SIGINT, SIGTERM, SIGHUP, SIGUSR1), and dies with the
parent (PR_SET_PDEATHSIG on Linux), so that a killed parent leaves no orphan training.
Its stderr comes through the parent line by line (TF's start-up notices dropped), the
last lines kept for the last word. The child writes its run folder's path to the file
MPT_RUN_DIR_FILE names as soon as the folder exists.
"""

import collections
import ctypes
import dataclasses
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import threading

from mpt import console
from mpt import errors
from mpt.errors import STOP_SIGNALS
from mpt.records import runs as runs_lib
from mpt.records import summary as summary_lib

ENV = "MPT_SUPERVISED"
RUN_DIR_FILE = "MPT_RUN_DIR_FILE"
# A file of `oom_kill N` lines standing in for the kernel's counters (tests: another
# process of the host may be OOM-killed while one runs).
OOM_KILLS_ENV = "MPT_OOM_KILLS"
PROC = pathlib.Path("/proc")
CGROUP = pathlib.Path("/sys/fs/cgroup")
# Endings a run recorded itself: a death after one leaves summary.json as it was.
RECORDED = ("completed", "interrupted", "diverged")


def supervised() -> bool:
  return os.environ.get(ENV) == "1"


def note_run_dir(run_dir: pathlib.Path) -> None:
  """In the child: where its run folder is, for the parent's last word."""
  target = os.environ.get(RUN_DIR_FILE)
  if target:
    pathlib.Path(target).write_text(str(run_dir))


def _counter_files() -> list[pathlib.Path]:
  """The kernel's OOM-kill counters for this process: its memory cgroup's (v2
  memory.events, v1 memory.oom_control) and the host's (/proc/vmstat)."""
  if os.environ.get(OOM_KILLS_ENV):
    return [pathlib.Path(os.environ[OOM_KILLS_ENV])]
  files = [PROC / "vmstat"]
  try:
    lines = (PROC / "self" / "cgroup").read_text().splitlines()
  except OSError:
    lines = []
  for line in lines:
    _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
    if controllers == "":
      files.append(CGROUP / path.lstrip("/") / "memory.events")
    elif "memory" in controllers.split(","):
      files.append(CGROUP / "memory" / path.lstrip("/") / "memory.oom_control")
  return files


def oom_kills() -> dict[str, int]:
  """Each readable OOM-kill counter's value, by file; empty where none is readable."""
  counts = {}
  for path in _counter_files():
    try:
      for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
          counts[str(path)] = int(value)
    except OSError:
      continue
  return counts


def count_stand_in_oom_kill() -> None:
  """One more `oom_kill` in the stand-in counter file, if `MPT_OOM_KILLS` names one:
  what the kernel does for its own counters, done by an injected OOM kill
  (mpt/injection.py)."""
  path = os.environ.get(OOM_KILLS_ENV)
  if path:
    count = sum(oom_kills().values())
    pathlib.Path(path).write_text(f"oom_kill {count + 1}\n")


def oom_killed(before: dict[str, int], after: dict[str, int]) -> bool | None:
  """Whether a counter rose between the two readings; None if none was read twice."""
  both = before.keys() & after.keys()
  return any(after[k] > before[k] for k in both) if both else None


def die_with_parent() -> None:
  """In a child, before exec: it gets SIGKILL when its parent dies (Linux)."""
  try:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux).
  except (OSError, AttributeError):
    pass


class _Stderr(threading.Thread):
  """The child's stderr, passed on line by line as it comes (TensorFlow's start-up INFO
  notices dropped, and its no-driver cuInit line said once in mpt's words,
  console.NO_GPU: the child has no filter of its own), its last lines kept for the
  last word; it drains the pipe after a crash, so nothing written just before one is
  lost."""

  def __init__(self, pipe):
    super().__init__(name="mpt-child-stderr", daemon=True)
    self.pipe, self.last = pipe, collections.deque(maxlen=LAST_LINES)
    self.filter = console.StartupFilter()

  def run(self) -> None:
    # A stop signal must reach the main thread, whose handler forwards it: one taken
    # by this thread would leave the main thread blocked in waitpid, and the child
    # training on, never told.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    said_no_gpu = False
    for line in iter(self.pipe.readline, b""):
      keep = self.filter.keep(line)
      if self.filter.no_driver and not said_no_gpu:
        os.write(1, (console.NO_GPU + "\n").encode())
        said_no_gpu = True
      if not keep:
        continue
      os.write(2, line)
      text = line.decode(errors="replace").rstrip()
      if text.strip() and not FAULTHANDLER.match(text):
        self.last.append(text)


def run(argv: list[str], child_env: dict[str, str] | None = None) -> int:
  """Runs `python -m mpt.main argv[1:]` as a watched child, with `child_env` added to
  its environment (what must be set before TensorFlow starts: TF_ENABLE_ONEDNN_OPTS);
  returns its exit status, or, after recording a death by signal, the status
  errors.EXIT gives it (oom, crashed, killed)."""
  with tempfile.NamedTemporaryFile(prefix="mpt-run-dir-", delete=False) as f:
    marker = pathlib.Path(f.name)
  env = {**os.environ, **(child_env or {}), ENV: "1", RUN_DIR_FILE: str(marker)}
  before = oom_kills()
  proc = subprocess.Popen([sys.executable, "-m", "mpt.main", *argv[1:]], env=env,
                          start_new_session=True, stderr=subprocess.PIPE,
                          preexec_fn=die_with_parent if sys.platform == "linux" else None)
  reader = _Stderr(proc.stderr)
  reader.start()
  # Every stop signal reaches the child once (its own session: none reaches it
  # directly), and none kills this process: an SSH session closing (SIGHUP) must
  # not take the child down with no checkpoint through PDEATHSIG.
  forward = lambda signum, frame: proc.send_signal(signum)
  previous = {s: signal.signal(s, forward) for s in STOP_SIGNALS}
  try:
    code = proc.wait()
    # Its stderr to its end; not forever: a process the child left behind may still
    # hold the pipe open.
    reader.join(timeout=READER_WAIT_S)
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
    run_dir = marker.read_text().strip() if marker.exists() else ""
    marker.unlink(missing_ok=True)
  if code >= 0:
    return code
  death = Death(signal.Signals(-code), oom_killed(before, oom_kills()), list(reader.last))
  return _died(death, pathlib.Path(run_dir) if run_dir else None)


# Python's faulthandler dump (where the interpreter was, not what went wrong): passed
# on, but not among the last error lines.
FAULTHANDLER = re.compile(r"^(Fatal Python error|Current thread|Thread 0x|\s+File \"|"
                          r"Extension modules:|<no Python frame>|  <no Python frame>)")
LAST_LINES, LAST_SHOWN = 50, 8
READER_WAIT_S = 10.0  # The child's stderr lines kept, and shown on a death.
# What a dying process's last lines say about memory (TF's allocator, C++'s new).
MEMORY_WORDS = ("std::bad_alloc", "out of memory", "resourceexhausted", "oom when",
                "failed to allocate", "cannot allocate memory")
# TF's CPU-feature guard: a wheel built for instructions this CPU lacks (BUILD.md's
# -march=native build moved to a lesser CPU), which it says just before aborting.
ISA_GUARD = re.compile(r"compiled to use (.+?) instructions, but these aren't available")


@dataclasses.dataclass
class Death:
  """How the child died: its signal, whether the kernel counted an OOM kill while it
  ran (None: no counter readable), its last stderr lines."""
  sig: signal.Signals
  counted: bool | None
  last: list[str]

  def named(self, run_dir: pathlib.Path | None, summary) -> tuple[str, str]:
    """(status, why): named by what is known, never by the signal alone."""
    phase = ("before its run folder existed (starting up)" if run_dir is None else
             "after the run had ended and recorded itself" if summary is not None and
             summary.status in RECORDED else "while training")
    # What the last lines say: a memory error, TF's CPU-feature guard.
    memory = any(w in l.lower() for l in self.last for w in MEMORY_WORDS)
    isa = next((m.group(1) for m in map(ISA_GUARD.search, self.last) if m), None)
    died = f"the training process died of {self.sig.name} {phase}"
    if self.sig == signal.SIGKILL and self.counted is False:  # Sent from outside mpt.
      return "interrupted", ("the training process was killed (SIGKILL) from outside "
                             "mpt, not by the kernel's OOM killer (its OOM-kill counts "
                             "did not change)")
    if self.counted:
      return "oom", f"{died}: the kernel counted an OOM kill while it ran"
    if memory:
      return "oom", f"{died}: out of memory, as its last error line says"
    if isa:
      return "failed", (f"{died}: this TensorFlow was built for {isa} instructions, "
                        "which this CPU lacks (a -march=native build from another "
                        "machine? BUILD.md)")
    if self.sig == signal.SIGKILL:  # No counter readable: memory, most likely.
      return "oom", f"{died}, most likely out of memory (no OOM-kill counter readable)"
    counts = ("no OOM kill counted" if self.counted is False
              else "no OOM-kill counter readable")
    return "failed", f"{died} ({counts}: not memory, as far as mpt can tell)"


def _died(death: "Death", run_dir: pathlib.Path | None) -> int:
  """Records the death in summary.json and runs.csv (unless the run had already ended
  and recorded itself), prints the last word with the child's last error lines,
  returns the exit status."""
  summary = None
  if run_dir and run_dir.is_dir():
    path = run_dir / "summary.json"
    summary = summary_lib.read(path) if path.exists() else summary_lib.RunSummary(
        run_dir=str(run_dir))
  status, why = death.named(run_dir, summary)
  where = ""
  if summary is not None:
    if summary.status not in RECORDED:
      resume = (f"; --resume={run_dir} continues from its last checkpoint"
                if status == "interrupted" and summary.checkpoints else "")
      summary.status, summary.message = status, why + resume
      summary.write(run_dir / "summary.json")
      runs_lib.record(summary)
    where = f"; {run_dir / 'summary.json'} says so"
  lines = []
  if death.last and status != "interrupted":  # Above the verdict, which stays last.
    lines = ["mpt: the training process' last error lines:"] + [
        f"  {l}" for l in death.last[-LAST_SHOWN:]]
  lines.append(f"mpt: {status}: {why}{where}")
  print("\n".join(lines), file=sys.stderr, flush=True)
  return errors.exit_status(status, died=True)
