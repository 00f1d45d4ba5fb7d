"""The end of a run, one way for every entry point: the command line's run
(mpt/train/cli/run.py), a script's fit under mpt.callbacks and a loop under mpt.track
(mpt/train/script/library.py) all close through `close()`: the final TensorBoard figures,
summary.json, the run's line in runs.csv, the diagnosis and its TensorBoard text, in
that order, then `say_done()`'s closing line.

`attempt(part, fn, *args)` runs each part: the command line's raises (its run is
mpt's own), a script's is best effort (mpt/train/common/besteffort.py), and a part that
failed there is recorded in summary.json's `not_measured` (written again when the
diagnosis was the part that failed).
"""

import pathlib
import sys
from typing import Any, Callable

from mpt.measure import instrument
from mpt.records import runs as runs_lib
from mpt.records.rundir import AfterRun
from mpt.records.summary import RunSummary


def direct(part: str, fn: Callable[..., Any], *args, default=None, **kwargs):
  """A part run as it is: an error raises (the command line's own run)."""
  del part, default
  return fn(*args, **kwargs)


def close(summary: RunSummary, run_dir: pathlib.Path, writer: instrument.ScalarWriter,
          after_run: AfterRun | None, *, chief: bool = True,
          attempt: Callable[..., Any] = direct,
          announce: Callable[[], None] | None = None) -> str | None:
  """Writes the run's record and hands its folder to `after_run` (the chief's, and a
  run that did not fail: a traceback says enough); `announce` runs between the two
  (the command line's message). Returns the diagnosis' text, or None."""
  attempt("writer", writer.write_final, summary.to_dict())
  attempt("record", summary.write, run_dir / "summary.json")
  if chief:  # Its line in <logdir>/runs.csv, whatever the status.
    attempt("record", runs_lib.record, summary)
  if announce:
    announce()
  if not (after_run and chief and summary.status != "failed"):
    return None
  before = dict(summary.not_measured)
  text = attempt("diagnosis", after_run, run_dir)
  if summary.not_measured != before:  # The diagnosis failed: the record says so.
    attempt("record", summary.write, run_dir / "summary.json")
  if text:
    attempt("writer", writer.text, "diagnosis/report", text)
  return text


def say_done(summary: RunSummary, where, logdir, what: str = "") -> None:
  """The run's last line: where it is, its headline figures, how to look at it
  (`logdir` None: a worker that wrote no outputs)."""
  parts = [f"mpt: {summary.status}: {where}", what, f"{summary.steps} steps",
           summary.ms_per_step and f"{summary.ms_per_step:.1f} ms/step",
           summary.val_accuracy is not None and f"val_accuracy {summary.val_accuracy:.3f}",
           f"wall {summary.wall_s:.0f} s"]
  print(", ".join(p for p in parts if p), flush=True)
  if logdir is not None:
    print(f"mpt: look: tensorboard --logdir {logdir}", flush=True)


def say(message: str | None, status: str) -> None:
  """A stopped run's message: on stderr when it ran out of memory."""
  if message and status != "failed":
    print(message, file=sys.stderr if status == "oom" else sys.stdout, flush=True)
