"""A training run's last word when its process dies of a signal: `python -m mpt.main`
trains in a child it watches, so that a segfault, the kernel's OOM killer or an abort
ends in summary.json (status `oom`) and one line, not in a fault-handler dump.

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


def _die_with_parent() -> None:
  try:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux).
  except (OSError, AttributeError):
    pass


def run(argv: list[str]) -> int:
  """Runs `python -m mpt.main argv[1:]` as a watched child; returns its exit status,
  or OOM_EXIT after recording a memory death."""
  with tempfile.NamedTemporaryFile(prefix="mpt-run-dir-", delete=False) as f:
    marker = pathlib.Path(f.name)
  env = {**os.environ, ENV: "1", RUN_DIR_FILE: str(marker)}
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
  return _died(signal.Signals(-code), pathlib.Path(run_dir) if run_dir else None)


def _died(sig: signal.Signals, run_dir: pathlib.Path | None) -> int:
  memory = sig in MEMORY_SIGNALS
  why = (f"the training process died of {sig.name}"
         + (", most likely out of memory" if memory else ""))
  where = ""
  if run_dir and run_dir.is_dir():
    path = run_dir / "summary.json"
    summary = summary_lib.read(path) if path.exists() else summary_lib.RunSummary(
        run_dir=str(run_dir))
    if summary.status not in ("completed", "interrupted", "diverged"):
      summary.status = "oom" if memory else "failed"
      summary.message = why
      summary.write(path)
      runs_lib.record(summary)
    where = f"; {path} says so"
  print(f"mpt: {'oom' if memory else 'failed'}: {why}{where}", file=sys.stderr,
        flush=True)
  return OOM_EXIT if memory else 1
