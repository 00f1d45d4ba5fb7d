"""A training run's last word when its process dies of a signal: `python -m mpt.main`
trains in a child it watches, so that a segfault, the kernel's OOM killer or an abort
ends in summary.json (status `oom`) and one line, not in a fault-handler dump.

A SIGKILL is the OOM killer's only when the kernel counted an OOM kill while the child
ran (`oom_kills`: the memory cgroup's and the host's counters, Linux >= 4.13); one
without such a count came from outside (a user, a scheduler) and ends as
`interrupted`, resumable from the last checkpoint. Where no counter is readable, a
SIGKILL is taken for memory, as before the counters existed.

The parent imports no TensorFlow and does nothing else: the child gets the same
arguments and the terminal, its own process group (so that Ctrl-C reaches it once,
forwarded by the parent), and dies with the parent (PR_SET_PDEATHSIG on Linux), so
that a killed parent leaves no orphan training. The child writes its run folder's
path to the file MPT_RUN_DIR_FILE names as soon as the folder exists.
"""

import ctypes
import os
import pathlib
import signal
import subprocess
import sys
import tempfile

from mpt.records import runs as runs_lib
from mpt.records import summary as summary_lib

ENV = "MPT_SUPERVISED"
RUN_DIR_FILE = "MPT_RUN_DIR_FILE"
OOM_EXIT = 4
KILLED_EXIT = 128 + signal.SIGKILL  # As a shell reports a killed command.
# A file of `oom_kill N` lines standing in for the kernel's counters (tests: another
# process of the host may be OOM-killed while one runs).
OOM_KILLS_ENV = "MPT_OOM_KILLS"
PROC = pathlib.Path("/proc")
CGROUP = pathlib.Path("/sys/fs/cgroup")
# Deaths that memory explains far more often than anything else: SIGKILL (the kernel's
# OOM killer), SIGSEGV/SIGBUS (an allocation that failed where nothing checked it),
# SIGABRT (std::bad_alloc through TF's C++).
MEMORY_SIGNALS = (signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT)


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


def _die_with_parent() -> None:
  try:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux).
  except (OSError, AttributeError):
    pass


def run(argv: list[str], child_env: dict[str, str] | None = None) -> int:
  """Runs `python -m mpt.main argv[1:]` as a watched child, with `child_env` added to
  its environment (what must be set before TensorFlow starts: TF_ENABLE_ONEDNN_OPTS);
  returns its exit status, or, after recording a death by signal, OOM_EXIT (memory),
  KILLED_EXIT (a SIGKILL from outside) or 1."""
  with tempfile.NamedTemporaryFile(prefix="mpt-run-dir-", delete=False) as f:
    marker = pathlib.Path(f.name)
  env = {**os.environ, **(child_env or {}), ENV: "1", RUN_DIR_FILE: str(marker)}
  before = oom_kills()
  proc = subprocess.Popen([sys.executable, "-m", "mpt.main", *argv[1:]], env=env,
                          start_new_session=True,
                          preexec_fn=_die_with_parent if sys.platform == "linux" else None)
  forward = lambda signum, frame: proc.send_signal(signum)
  previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    code = proc.wait()
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
    run_dir = marker.read_text().strip() if marker.exists() else ""
    marker.unlink(missing_ok=True)
  if code >= 0:
    return code
  return _died(signal.Signals(-code), pathlib.Path(run_dir) if run_dir else None,
               oom_killed(before, oom_kills()))


def _died(sig: signal.Signals, run_dir: pathlib.Path | None,
          counted: bool | None) -> int:
  """Records the death (`counted`: whether the kernel counted an OOM kill meanwhile, None
  if unknown) in summary.json and runs.csv, prints the last line, returns the status."""
  resume = ""
  if sig == signal.SIGKILL and counted is False:  # Sent from outside mpt.
    status, code = "interrupted", KILLED_EXIT
    why = ("the training process was killed (SIGKILL) from outside mpt, not by the "
           "kernel's OOM killer (its OOM-kill counts did not change)")
    resume = f"; --resume={run_dir} continues from its last checkpoint"
  elif sig in MEMORY_SIGNALS:
    status, code = "oom", OOM_EXIT
    why = f"the training process died of {sig.name}" + (
        ": the kernel counted an OOM kill while it ran" if counted
        else ", most likely out of memory")
  else:
    status, code = "failed", 1
    why = f"the training process died of {sig.name}"
  where = ""
  if run_dir and run_dir.is_dir():
    path = run_dir / "summary.json"
    summary = summary_lib.read(path) if path.exists() else summary_lib.RunSummary(
        run_dir=str(run_dir))
    if summary.status not in ("completed", "interrupted", "diverged"):
      summary.status = status
      summary.message = why + (resume if summary.checkpoints else "")
      summary.write(path)
      runs_lib.record(summary)
    where = f"; {path} says so"
  print(f"mpt: {status}: {why}{where}", file=sys.stderr, flush=True)
  return code
