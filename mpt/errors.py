"""Bad user input, and the one table of exit statuses.

Anything the user can fix (an unknown policy, a missing data folder, an unwritable logs
root) raises `UserError`; `mpt.main` turns it into a single `mpt: error: ...` line on
stderr and exit status 2, as it does absl's own flag errors. Everything else is a bug
and keeps its traceback (exit status 1).

`EXIT` is every status mpt's command line ends with (docs/usage.md prints it, and
tests/test_exits.py makes each happen): a scheduler or CI job can branch on it.
"""

import signal

# The signals that stop a training run (or a sweep) at a step boundary, with a
# checkpoint: Ctrl-C, a polite kill, an SSH session closing, SLURM's `--signal`
# warning (Lightning's requeue signal).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)

EXIT = {
    "completed": 0,       # A sweep: every cell completed.
    "bug": 1,             # A Python traceback: a bug in mpt (or in a user's model code).
    "usage": 2,           # Bad input: one `mpt: error:` line; absl's flag errors too.
    "diverged": 3,        # The loss scale collapsed or the loss went non-finite.
    "oom": 4,             # Out of memory: the kernel's OOM counters rose, or the error
                          # said so (ResourceExhausted, bad_alloc).
    "crashed": 5,         # Died of a signal memory does not explain (SIGSEGV, SIGABRT,
                          # SIGBUS with no OOM count): the child's last error lines shown.
    "cells_failed": 6,    # A sweep that ran to its end with cells not completed.
    "killed": 128 + signal.SIGKILL,  # 137: SIGKILL from outside (not the OOM killer).
}


def stopped_by(signal_name: str | None) -> int:
  """128 + the signal that stopped the run at a step boundary (as a shell reports a
  command a signal ended): 130 SIGINT, 143 SIGTERM, 129 SIGHUP, 138 SIGUSR1."""
  return 128 + int(signal.Signals[signal_name or "SIGINT"])


def exit_status(status: str, stop_signal: str | None = None, died: bool = False) -> int:
  """The exit status of a run that ended with summary.json's `status`: the one map
  from that vocabulary to EXIT. A run that stopped itself at a step for a signal
  exits 128 + that signal; one whose process `died` of a signal (the supervisor saw
  it) exits `killed` where it was stopped from outside, `oom` or `crashed`."""
  if died:
    return EXIT["killed"] if status == "interrupted" else EXIT["oom"] if (
        status == "oom") else EXIT["crashed"]
  if status == "interrupted":
    return stopped_by(stop_signal)
  return EXIT["bug"] if status == "failed" else EXIT[status]


def ended(error: BaseException | None) -> tuple[str, str | None]:
  """(status, message) of a run that `error` ended (None: it ran to its end), in the
  one vocabulary of summary.json: Ctrl-C or a stop signal is `interrupted`, anything
  else `failed` with the error's type and text (the command line's run adds its own
  endings, diverged and oom, in mpt/train/cli/run.py)."""
  if error is None:
    return "completed", None
  if isinstance(error, KeyboardInterrupt):
    return "interrupted", "interrupted by Ctrl-C or a stop signal"
  return "failed", f"{type(error).__name__}: {error}".strip().rstrip(":")[:2000]


class UserError(Exception):
  """Bad input: reported as one line, never as a traceback."""
