"""One training run, start to finish: `train_and_evaluate(cfg)` -> summary dict.
(`--mode=inspect`, the same model built without training, is mpt/train/cli/dryrun.py.)

Three steps, read top to bottom in `train_and_evaluate`. Set up: `prepare(cfg)`
(mpt/train/cli/prepare.py: everything before step 1) returns the `Run`; its callbacks
(mpt/train/cli/callbacks.py) are made from it. Loop: the chosen loop
(mpt/train/cli/loops.py) runs with the callbacks and a utilisation sampler. Finish: the
run folder gets its event files, `flags.txt` (a flagfile that replays the run),
`dtypes.json`, `checkpoints/` and `summary.json` (the chief alone, under multi_worker),
and the run's line in `<logdir>/runs.csv` (mpt/records/runs.py).

However the loop ends, events are flushed and summary.json is written, with status
`completed`; `interrupted` (a stop signal, SIGINT, SIGTERM, SIGHUP or SIGUSR1: a
checkpoint is saved first, exit 128 + the signal); `diverged` (NaN/Inf loss or a
collapsed loss scale: the last good checkpoint is left as it was, exit 3); or `failed`
(a bug: the traceback follows). `_ending` maps each way out to its status and message,
`finish` writes them. Then `after_run` (the diagnosis, passed in by mpt/main.py) reads
the folder; its Markdown goes into the run's TensorBoard text. A run whose folder was
removed while it ran (its flags.txt is gone) says so and writes nothing more at its end:
no checkpoint, summary.json or diagnosis.
"""

import shutil
import signal
import sys
from typing import Any

import tensorflow as tf

from mpt import config
from mpt import errors
from mpt import injection
from mpt.measure import memory
from mpt.records.rundir import AfterRun
from mpt.records.summary import RunSummary
from mpt.train.cli import callbacks as callbacks_lib
from mpt.train.cli import checkpoint
from mpt.train.common import ending
from mpt.train.cli import guards
from mpt.train.cli import loops
from mpt.train.cli import record
from mpt.train.common import steps as steps_lib
from mpt.train.cli.callbacks import RunCallbacks
from mpt.train.cli.prepare import Run, prepare


def train_and_evaluate(cfg: config.Config,
                       after_run: AfterRun | None = None) -> dict[str, Any]:
  """Runs one training run as `cfg` says; returns what it wrote to summary.json."""
  run = prepare(cfg)
  cbs = callbacks_lib.make(run)
  status, message = "failed", None  # Until the loop returns or is stopped.
  try:
    _loop(run, cbs)
    status = "completed"
  except BaseException as e:  # Every way out has its status; a failure raises on.
    status, message = _ending(e, run, cbs)
    if status == "failed":
      raise
  finally:
    try:
      summary = finish(run, cbs, status, message, after_run)
    finally:
      cbs.stop.uninstall()  # Every way out of finish (it may have done so already).
  # The run's last lines: where it is, its headline figures, how to look at it.
  chief = run.dist.is_chief
  where = run.run_dir if chief else f"{run.dist.task} (the chief wrote the outputs)"
  ending.say_done(summary, where, run.cfg.logdir if chief else None)
  return summary.to_dict()


def _loop(run: Run, cbs: RunCallbacks) -> None:
  """The run's steps from `start_step` on, and the checkpoint at their end."""
  cfg = run.cfg
  cbs.stop.install()
  injection.inject_run_fault(cfg.batch_size, cfg.policy)
  if run.sampler:
    run.sampler.start()
  with run.dist.strategy.scope():
    loops.LOOPS[cfg.loop](run.model, run.optimizer, run.data, cfg, cbs.ordered,
                          fetch=cbs.timer.fetch if cfg.instrument else None,
                          loss=steps_lib.make_loss(cbs.loss_factor),
                          start_step=run.start_step)
  cbs.checkpoints.save()


def _ending(e: BaseException, run: Run, cbs: RunCallbacks) -> tuple[str, str | None]:
  """(status, message) of a run the exception `e` stopped: `interrupted` (Ctrl-C or
  SIGTERM, its checkpoint saved here first; or a worker of the cluster lost),
  `diverged`, `oom`, or `failed` (the caller raises `e` on)."""
  cfg, ckpt, done = run.cfg, run.ckpt, cbs.counter.done
  if isinstance(e, (KeyboardInterrupt, guards.Interrupted, checkpoint.FolderGone)):
    if _folder_gone(run):
      return "interrupted", (f"mpt: interrupted at step {done}; the run folder "
                             f"{run.run_dir} was removed while the run ran: no "
                             "checkpoint saved at the stop, no summary.json or diagnosis "
                             "written")
    saved = cbs.checkpoints.save() or ckpt.latest
    return "interrupted", f"mpt: interrupted at step {done}; " + (
        f"checkpoint {saved}" if cfg.checkpoint
        else "no checkpoint (--checkpoint=false): this run cannot be resumed")
  if isinstance(e, guards.Diverged):
    return "diverged", (f"mpt: {e}; last good checkpoint: {ckpt.latest or 'none'} "
                        f"(resume with --resume={run.run_dir})")
  if isinstance(e, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)):
    if run.dist.workers < 2:  # No cluster to lose: a failure.
      return errors.ended(e)
    return "interrupted", _lost_worker(e, run, done)
  if isinstance(e, tf.errors.ResourceExhaustedError):  # An allocation TF can't make.
    first = (str(e).strip().splitlines() or [""])[0][:300]
    plan = run.before.memory
    return "oom", (f"mpt: out of memory at step {done + 1}: {first}; the estimate was "
                   f"{memory.human(plan.estimate.total_mb)} with "
                   f"{memory.human(plan.available_mb)} available (a smaller "
                   "--batch_size or a 16-bit --policy needs less)")
  return errors.ended(e)  # Failed: summary.json keeps why; the traceback follows.


def _lost_worker(e: tf.errors.OpError, run: Run, done: int) -> str:
  """The message of a cluster run whose collectives were aborted: a worker died (TF's
  heartbeats noticed) or stopped answering for --collective_timeout; nothing more is
  saved, so each worker restarts from the chief's last checkpoint."""
  cfg, dist = run.cfg, run.dist
  lines = [l.strip() for l in str(e).splitlines() if l.strip()] or [""]
  why = next((l for l in lines if "aborted by" in l or "timed out" in l), lines[0])
  if isinstance(e, tf.errors.DeadlineExceededError):
    why = f"no answer within --collective_timeout={cfg.collective_timeout:g} s: {why}"
  folder = run.run_dir if dist.is_chief or cfg.resume else "<the chief's run folder>"
  return (f"mpt: interrupted at step {done}: another worker of the "
          f"cluster stopped answering ({why[:300]}); restart every "
          f"worker with --resume={folder} (from the chief's last checkpoint"
          f"{': ' + str(run.ckpt.latest) if dist.is_chief else ''})")


def _folder_gone(run: Run) -> bool:
  """Whether the chief's run folder was removed while the run ran (TF's checkpoint
  writer may have made the folder again, but not its flags.txt)."""
  return run.dist.is_chief and not (run.run_dir / "flags.txt").exists()


def finish(run: Run, cbs: RunCallbacks, status: str, message: str | None,
           after_run: AfterRun | None = None) -> RunSummary:
  """However the run ended: stops what runs beside the loop, writes summary.json and
  the final figures, the run's line in runs.csv, says `message`, and hands the folder
  to `after_run`; returns the summary. A first stop signal meanwhile is taken and not
  acted on (the run has ended; the default action would end it with its files half
  written; a second exits at once); the diagnosis after them can be stopped as any
  command can."""
  if cbs.window:
    cbs.window.close()
  if run.sampler:
    run.sampler.stop()
  if cbs.numerics and status in ("completed", "diverged") and not _folder_gone(run):
    cbs.numerics.finish()  # The end's sample (best effort).
  summary = record.build(run, cbs.timer, status, message, cbs.flops)
  if status == "interrupted" and cbs.stop.signal is not None:
    summary.stop_signal = signal.Signals(cbs.stop.signal).name
  if _folder_gone(run):  # Nothing to write into; say why once.
    print(message or f"mpt: {status}; the run folder {run.run_dir} was removed while "
          "the run ran: no summary.json or diagnosis written", file=sys.stderr, flush=True)
    cbs.writer.close()
    return summary

  def announce():  # Between the record and the diagnosis: the stop handlers go.
    cbs.stop.uninstall()
    ending.say(message, status)

  chief = run.dist.is_chief
  ending.close(summary, run.out_dir, cbs.writer, after_run, chief=chief,
               announce=announce)
  cbs.writer.close()
  if not chief:
    shutil.rmtree(run.out_dir, ignore_errors=True)
    summary.run_dir = None
  return summary
