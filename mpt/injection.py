"""Fault injection for sweeps: `MPT_INJECT_FAULT=KIND:N[/POLICY],...` ends each run of
batch size N (under POLICY only, if given) the way a sweep cell can end badly, right
before its first step, so that the sweep's handling of every ending can be tested and
shown: `oom`, `kill`, `fail`, `segv`. Like `--fault_factor` for one run (mpt/train/cli/guards.py), it is
documented in docs/usage.md; unset, it costs nothing.

And kills at a chosen moment of a run, for resume to be tested where random kills
land: `MPT_KILL_AT=MOMENT:N` sends SIGKILL to the process `begin` as global step N
begins, at the `end` of step N (after all its callbacks), in the middle of
checkpoint N's `save` (its files written, the index not yet naming it), or in the
`eval`uation that follows step N (at its first batch).

TensorFlow is imported only to raise its error, so the sweep (which imports no
TensorFlow) can check the variable before its first cell.
"""

import os
import signal
import sys
import time

from mpt.errors import UserError


def injected_faults() -> list[tuple[str, int, str]]:
  """`MPT_INJECT_FAULT=KIND:N[/POLICY],...` as (kind, batch size, policy or "");
  UserError naming the bad part, so a typo stops a sweep before its first cell."""
  faults = []
  for spec in filter(None, os.environ.get("MPT_INJECT_FAULT", "").split(",")):
    kind, _, target = spec.partition(":")
    batch, _, policy = target.partition("/")
    if kind not in ("oom", "kill", "fail", "segv") or not batch.isdigit():
      raise UserError(f"MPT_INJECT_FAULT: {spec!r} is not KIND:N[/POLICY] with KIND "
                      "oom, kill, fail or segv")
    faults.append((kind, int(batch), policy))
  return faults


KILL_MOMENTS = ("begin", "end", "save", "eval", "hang")


def kill_at() -> tuple[str, int] | None:
  """`MPT_KILL_AT=MOMENT:N` as (moment, N); UserError naming the bad value."""
  spec = os.environ.get("MPT_KILL_AT", "")
  if not spec:
    return None
  moment, _, step = spec.partition(":")
  if moment not in KILL_MOMENTS or not step.isdigit():
    raise UserError(f"MPT_KILL_AT: {spec!r} is not MOMENT:N with MOMENT one of "
                    f"{', '.join(KILL_MOMENTS)} and N a global step")
  return moment, int(step)


def kill_point(moment: str, step: int) -> None:
  """SIGKILL to this process if `MPT_KILL_AT` names this moment of this step (at
  `end` of it, `hang` instead sleeps for good)."""
  at = kill_at()
  if at == (moment, step):
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
  if moment == "end" and at == ("hang", step):
    while True:
      time.sleep(3600)


def inject_run_fault(batch_size: int, policy: str) -> None:
  """Ends this run as `MPT_INJECT_FAULT` asks for its batch size and policy, right
  before its first step: `oom` raises TensorFlow's ResourceExhaustedError (as when an
  allocation fails), `kill` sends SIGKILL to itself as the kernel's OOM killer does
  (counting the kill in the stand-in counters `MPT_OOM_KILLS` names, if any, as the
  kernel counts its own: mpt/supervisor.py), `fail` raises an exception (as a bug),
  `segv` dies of SIGSEGV with a line on stderr (a crash in native code, no OOM). No
  memory is exhausted: a real OOM cannot be forced portably, and a sweep's handling of
  each ending must still be testable."""
  for kind, batch, only in injected_faults():
    if batch != batch_size or only not in ("", policy):
      continue
    spec = f"{kind}:{batch}" + (f"/{only}" if only else "")
    if kind == "kill":
      from mpt import supervisor  # The counters' owner.
      supervisor.count_stand_in_oom_kill()
      sys.stdout.flush()
      os.kill(os.getpid(), signal.SIGKILL)
    if kind == "segv":
      os.write(2, f"native crash (injected: MPT_INJECT_FAULT={spec})\n".encode())
      signal.signal(signal.SIGSEGV, signal.SIG_DFL)  # No faulthandler dump.
      os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "oom":
      import tensorflow as tf
      raise tf.errors.ResourceExhaustedError(
          None, None, f"OOM when allocating tensor with batch {batch_size} "
          f"(injected: MPT_INJECT_FAULT={spec})")
    raise RuntimeError(f"injected failure (MPT_INJECT_FAULT={spec})")

