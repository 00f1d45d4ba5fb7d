"""One sweep cell as a child `python -m mpt.main`, and how it ended: the same on this
machine (mpt/sweep/run.py) and on a Ray node (mpt/sweep/cluster.py). The child's exit
status and last error line classify it (ok, OOM, OOM (predicted), timeout, failed,
interrupted), with the kernel's OOM-kill counters of the machine it ran on.
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
from mpt.records.cells import Cell

POLL_S = 0.5  # The slices a cell's wait is made of.
# SweepOptions fields that are the sweep's axes: (the Config field of one cell, type).
AXES = {"batch_sizes": ("batch_size", int), "policies": ("policy", str),
        "loops": ("loop", str), "image_sizes": ("image_size", int),
        "models": ("model", str), "jit_compiles": ("jit_compile", bool),
        "seeds": ("seed", int)}  # --seeds=N: a count, from --seed on.


def cell_flags(cfg: config.Config, cell: Cell, out: pathlib.Path) -> list[str]:
  """The child's flags: the sweep's Config with the cell's value on each axis."""
  axes = {field: getattr(cell, field) for field, _ in AXES.values()}
  # No checkpoints: a cell is never resumed (a rerun starts clean), and a sweep's
  # cells would otherwise leave megabytes each.
  run = dataclasses.replace(cfg, run_name=cell.id, logdir=str(out / "cells"),
                            verbose=0, checkpoint=False, **axes)
  return config.to_flagfile(run).splitlines()


def error_line(stderr: str) -> str:
  lines = [l.strip() for l in stderr.splitlines() if l.strip()]
  errors = [l for l in lines if "Error" in l or l.startswith("mpt: error")]
  return (errors or lines or [""])[-1][:300]


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
  ended = lambda status, error="", **figures: dataclasses.replace(
      cell, status=status, error=error, run_dir=str(run_dir), **figures)
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
  if proc.returncode == -signal.SIGKILL:  # Not by us; the OOM killer if it counted one.
    if supervisor.oom_killed(before, supervisor.oom_kills()) is False:
      return ended("failed", "killed (SIGKILL) from outside, not by the OOM killer")
    return ended("OOM", "killed (SIGKILL)")
  if proc.returncode == supervisor.OOM_EXIT or (
      proc.returncode and "ResourceExhaustedError" in stderr):
    return ended("OOM", error_line(stderr) or "out of memory")
  if proc.returncode == EXIT["usage"] and "mpt: error: memory:" in stderr:
    return ended("OOM (predicted)", error_line(stderr))
  if proc.returncode:
    return ended("failed", error_line(stderr))
  return ended("ok", **cells_lib.figures_from_summary(run_dir / "summary.json"))


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
