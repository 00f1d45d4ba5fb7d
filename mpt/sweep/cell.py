"""One sweep cell as a child `python -m mpt.main`, and how it ended: the same on this
machine (mpt/sweep/run.py) and on a Ray node (mpt/sweep/cluster.py): as its run
recorded itself in summary.json, else by the child's exit status (errors.EXIT) or
death (named as mpt/supervisor.py names one, by that machine's OOM-kill counters);
the sweep's own timer and stop say `timeout` and `interrupted`.
"""

import dataclasses
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

from mpt import config
from mpt import supervisor
from mpt.errors import EXIT, STOP_SIGNALS
from mpt.records import cells as cells_lib
from mpt.records import summary as summary_lib
from mpt.records.cells import Cell

POLL_S = 0.5  # The slices a cell's wait is made of.
# SweepOptions fields that are the sweep's axes: (the Config field of one cell, type).
AXES = {"batch_sizes": ("batch_size", int), "policies": ("policy", str),
        "loops": ("loop", str), "image_sizes": ("image_size", int),
        "models": ("model", str), "jit_compiles": ("jit_compile", bool),
        "seeds": ("seed", int)}  # --seeds=N: a count, from --seed on.
# summary.json's `status` in sweep.csv's words (the seed's table's); others as recorded.
WORDS = {"completed": "ok", "oom": "OOM"}


def cell_flags(cfg: config.Config, cell: Cell, out: pathlib.Path) -> list[str]:
  """The child's flags: the sweep's Config with the cell's value on each axis."""
  axes = {field: getattr(cell, field) for field, _ in AXES.values()}
  # No checkpoints: a cell is never resumed (a rerun starts clean), and a sweep's
  # cells would otherwise leave megabytes each.
  run = dataclasses.replace(cfg, run_name=cell.id, logdir=str(out / "cells"),
                            verbose=0, checkpoint=False, **axes)
  return config.to_flagfile(run).splitlines()


def _child_setup() -> None:
  """In the cell's child before exec: stop signals at their defaults and unblocked (a
  Ray worker ignores or blocks them, and both survive exec, so the child would never
  see a stop), and death with its parent."""
  for sig in STOP_SIGNALS:
    signal.signal(sig, signal.SIG_DFL)
  # A blocked mask survives exec too.
  signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
  if sys.platform == "linux":
    supervisor.die_with_parent()


def _wait(proc: subprocess.Popen, timeout: float | None) -> str:
  """The child's stderr once it ends; TimeoutExpired after `timeout` seconds. Waits in
  short slices: a Ray task cancelled meanwhile gets its KeyboardInterrupt only when
  Python code runs, not inside one long blocking wait."""
  deadline = None if timeout is None else time.monotonic() + timeout
  while True:
    left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
    try:
      return proc.communicate(timeout=max(left, 0))[1]
    except subprocess.TimeoutExpired:
      if deadline is not None and time.monotonic() >= deadline:
        raise


def run_cell(cfg: config.Config, cell: Cell, out: pathlib.Path,
             timeout: float | None, env: dict[str, str] | None = None) -> Cell:
  """Runs one cell as a child `python -m mpt.main` (in `env`, else this process'
  environment); returns it with how it ended."""
  run_dir = out / "cells" / cell.id
  if run_dir.exists():  # A rerun (--force, or after a failure) starts clean.
    shutil.rmtree(run_dir)
  cmd = [sys.executable, "-m", "mpt.main", *cell_flags(cfg, cell, out)]
  before = supervisor.oom_kills()
  # Its own session (a signal to the sweep's group does not reach it twice), and it
  # dies with whoever runs it: a sweep, or a Ray worker a cancelled task took down.
  proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, start_new_session=True, env=env,
                          preexec_fn=_child_setup)
  ended = lambda status, error, figures=None: dataclasses.replace(
      cell, status=status, error=error, run_dir=str(run_dir), **(figures or {}))
  try:
    stderr = _wait(proc, timeout)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    return ended("timeout", f"killed after {timeout:g} s")
  except KeyboardInterrupt as e:  # Stop the child the way the signal stops a run.
    signum = getattr(e, "signum", signal.SIGINT)
    _stop(proc, signum)
    return ended("interrupted", signal.Signals(signum).name)
  return ended(*outcome(proc.returncode, stderr, run_dir, before))


def outcome(code: int, stderr: str, run_dir: pathlib.Path,
            before: dict[str, int]) -> tuple[str, str, dict]:
  """(status, error, figures) of a cell whose child exited with `code`: its run's record
  (its supervisor records a death there too); without one, its exit status, or its
  death where its supervisor died too, and its last error line."""
  lines = [l.strip() for l in stderr.splitlines() if l.strip()]
  said = [l for l in lines if "Error" in l or l.startswith("mpt: error")] or lines or [""]
  path, error = run_dir / "summary.json", said[-1][:300]
  if path.exists():
    run = summary_lib.read(path)
    status, error = run.status, run.message or ""
  elif code < 0:
    death = supervisor.Death(signal.Signals(-code), supervisor.oom_killed(
        before, supervisor.oom_kills()), [])
    status, error = death.named(run_dir if run_dir.is_dir() else None, None)
  elif code == EXIT["usage"] and error.startswith("mpt: error: memory:"):
    return "OOM (predicted)", error, {}  # The preflight refused it: no run folder.
  else:
    status = "oom" if code == EXIT["oom"] else "failed"
  figures = cells_lib.figures_from_summary(path) if status == "completed" else {}
  return WORDS.get(status, status), error, figures


def _stop(proc: subprocess.Popen, signum: int) -> None:
  """Sends the stop to the child's group and waits until the child has ended. A
  stop meanwhile (a second Ctrl-C; Ray cancelling again) is sent on too: the child's
  second signal, on which it exits at once."""
  while True:
    try:
      os.killpg(proc.pid, signum)
    except ProcessLookupError:  # Ended already.
      pass
    try:
      proc.communicate()
      return
    except KeyboardInterrupt as e:
      signum = getattr(e, "signum", signal.SIGINT)


class Stopped(KeyboardInterrupt):
  """A stop signal (errors.STOP_SIGNALS) reached the sweep: `signum` names it."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


def stop(signum, frame):
  raise Stopped(signum)
