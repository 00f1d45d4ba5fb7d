"""Checkpoints and resuming: a run that dies at epoch 17 of 20 costs minutes, not hours.

`Checkpointer` keeps `<run>/checkpoints/` with `tf.train.CheckpointManager`: the model
(weights and BatchNorm statistics), the optimizer (Adam's moments and iteration count;
under mixed_float16 the LossScaleOptimizer's scale and growth counter), and the global
step and epoch. Beside each checkpoint, `state-<step>.json` holds what a resumed run
needs to report the whole run as if it had never stopped: step times so far, the last
epoch's figures, the running epoch's metric state (`RunningMetrics`), the
utilisation sampler's totals, wall time. Before each save the event writer is
flushed, so every summary up to the checkpoint's step is on disk; a resumed run drops
the ones after it (`prune_events`) and writes them again.

A checkpoint at an epoch's last step is written at the epoch's end, after its
evaluation: one taken before would resume into the next epoch and lose that
evaluation and the epoch's figures.

The input position is not stored in the checkpoint: the training stream is a pure
function of the seed (seeded shuffle, fixed order), so a resumed run rebuilds it and
skips the batches already consumed. That restores the exact position without saving
the shuffle buffer and the cache (gigabytes at 256 px) into every checkpoint.

Atomicity: TensorFlow writes a checkpoint's data files first and then replaces the
`checkpoint` index file by rename, so a process killed while saving leaves the index
naming the previous, complete checkpoint. If the newest checkpoint still fails to
restore (a damaged file), `restore` says so and falls back to the one before it.
"""

import json
import pathlib
import time
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from mpt import injection
from mpt import files
from mpt.errors import UserError

# Summaries that describe a run's end: an earlier, stopped attempt's are dropped on
# resume, since the resumed run writes its own.
END_TAGS = ("final/", "diagnosis/")


class Checkpointer:
  """Saves and restores model, optimizer, step and epoch under `<run>/checkpoints`."""

  def __init__(self, run_dir: pathlib.Path, model: keras.Model,
               optimizer: keras.optimizers.Optimizer, keep: int = 3,
               write_dir: pathlib.Path | None = None):
    # A non-chief worker restores from the run folder but saves into its scratch
    # folder (`write_dir`): it must join every save, but its files are thrown away.
    self.read_dir = run_dir / "checkpoints"
    self.dir = (write_dir or run_dir) / "checkpoints"
    self.keep = keep
    self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
    self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
    self.ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=self.step,
                                    epoch=self.epoch)
    self.manager = tf.train.CheckpointManager(self.ckpt, str(self.dir), max_to_keep=keep)
    self.save_ms: list[float] = []
    self.last_saved_step = -1

  @property
  def latest(self) -> str | None:
    return self.manager.latest_checkpoint

  def save(self, step: int, epoch: int, state: dict[str, Any]) -> str:
    """Writes checkpoint `step` and its state sidecar; returns the checkpoint path."""
    start = time.perf_counter()
    self.step.assign(step)
    self.epoch.assign(epoch)
    # The sidecar first: a checkpoint the index names always has its state.
    self.dir.mkdir(parents=True, exist_ok=True)
    files.write_json(self.dir / f"state-{step}.json", state)
    # Runs once the checkpoint's files are written, before the index names them.
    written = tf.train.CheckpointOptions(
        experimental_write_callbacks=[lambda _: injection.kill_point("save", step)])
    path = self.manager.save(checkpoint_number=step, options=written)
    kept = {int(p.rsplit("-", 1)[1]) for p in self.manager.checkpoints}
    for old in self.dir.glob("state-*.json"):
      if int(old.stem.split("-")[1]) not in kept:
        old.unlink(missing_ok=True)
    self.save_ms.append((time.perf_counter() - start) * 1e3)
    self.last_saved_step = step
    return path

  def restore(self) -> tuple[int, int, dict[str, Any]]:
    """Restores the newest checkpoint that loads; returns (step, epoch, state)."""
    manager = self.manager if self.read_dir == self.dir else \
        tf.train.CheckpointManager(self.ckpt, str(self.read_dir), max_to_keep=self.keep)
    candidates = list(reversed(manager.checkpoints))
    if not candidates:
      raise UserError(f"no checkpoint to resume from in {self.read_dir}")
    for path in candidates:
      step = int(path.rsplit("-", 1)[1])
      try:
        self.ckpt.restore(path).assert_existing_objects_matched()
        state = json.loads((self.read_dir / f"state-{step}.json").read_text())
      except Exception as e:  # A damaged file fails in many ways (OpError, IndexError...).
        print(f"WARNING: checkpoint {path} does not restore "
              f"({str(e).splitlines()[0][:200]}); trying the one before it", flush=True)
        continue
      self.last_saved_step = step
      return int(self.step.numpy()), int(self.epoch.numpy()), state
    raise UserError(f"none of the checkpoints in {self.read_dir} restores "
                    f"({', '.join(pathlib.Path(p).name for p in candidates)})")


class FolderGone(Exception):
  """The run folder was removed under a running run: nothing more can be recorded."""


class CheckpointCallback(keras.callbacks.Callback):
  """Saves every `every` global steps and at each epoch end, for both loops;
  `steps()` is the global steps completed (the run's one step counter), `flush()`
  puts the run's summaries so far on disk."""

  def __init__(self, checkpointer: Checkpointer, every: int, steps_per_epoch: int,
               steps, state_fn, enabled: bool = True,
               flush: Callable[[], None] | None = None):
    super().__init__()
    self.ckpt, self.every, self.steps_per_epoch = checkpointer, every, steps_per_epoch
    self.steps, self.state_fn, self.flush = steps, state_fn, flush
    self.enabled = enabled  # False: --checkpoint=false, nothing is ever written.
    self._epoch_ended_at = -1

  def save(self) -> str | None:
    """Saves at the current step; None where nothing is saved (disabled, saved
    already, or an epoch's last step whose end has not happened yet)."""
    step = self.steps()
    if not self.enabled or step == self.ckpt.last_saved_step or (
        step % self.steps_per_epoch == 0 and step != self._epoch_ended_at):
      return None
    if self.flush:
      self.flush()
    try:
      return self.ckpt.save(step, step // self.steps_per_epoch, self.state_fn())
    except (tf.errors.NotFoundError, OSError):
      run_dir = self.ckpt.read_dir.parent
      if self.ckpt.dir == self.ckpt.read_dir and not (run_dir / "flags.txt").exists():
        raise FolderGone(f"the run folder {run_dir} was removed while the run ran") \
            from None
      raise

  def on_train_batch_end(self, batch, logs=None):
    if self.every and self.steps() % self.every == 0:
      self.save()

  def on_epoch_end(self, epoch, logs=None):
    self._epoch_ended_at = self.steps()
    self.save()


class RunningMetrics(keras.callbacks.Callback):
  """The running epoch's metric state (the loss tracker's and each metric's totals
  and counts): `state()` for each checkpoint, and put back at the begin of the epoch
  a run resumes in the middle of, after the loop has reset its metrics, so that the
  epoch's train figures cover all its steps, not only those after the resume.

  The metrics are `fit`'s (`model.metrics`) unless a loop says where its own are
  (`use`). Values are kept per local replica, as exact floats: MirroredStrategy's
  replicas each keep their share, and `fit` averages the replicas' results. Under
  multi_worker only the chief's shares are in the run folder, and every worker
  takes them: there that epoch's train figures are approximate."""

  def __init__(self, saved: list | None = None, resume_epoch: int | None = None):
    super().__init__()
    self.saved, self.resume_epoch = saved, resume_epoch
    self._source: Callable[[], list] | None = None

  def use(self, source: Callable[[], list]) -> None:
    self._source = source

  def _parts(self) -> list[list[tf.Variable]]:
    metrics = self._source() if self._source else self.model.metrics
    tf_vars = [v.value if isinstance(v, keras.Variable) else v
               for m in metrics for v in m.variables]
    return [list(getattr(v, "values", None) or (v,)) for v in tf_vars]

  def state(self) -> list[list[Any]]:
    return [[np.asarray(p.numpy()).tolist() for p in parts] for parts in self._parts()]

  def on_epoch_begin(self, epoch, logs=None):
    if self.saved is None or epoch != self.resume_epoch:
      return
    parts = self._parts()
    if len(parts) != len(self.saved):
      raise UserError(f"the checkpoint's metric state has {len(self.saved)} variables "
                      f"and this run's metrics {len(parts)}: not the run it was saved by")
    for mine, saved in zip(parts, self.saved):
      for i, part in enumerate(mine):
        part.assign(np.asarray(saved[min(i, len(saved) - 1)],
                               dtype=part.dtype.as_numpy_dtype))
    self.saved = None


def prune_events(run_dir: pathlib.Path, last_step: int) -> None:
  """Drops summaries after `last_step`, and those of a run's end (END_TAGS), from the
  run's event files: a resumed run repeats the steps after its checkpoint, which
  TensorBoard would show twice (once from the killed process, once from the resumed)."""
  ended = lambda e: any(v.tag.startswith(END_TAGS) for v in e.summary.value)
  for path in sorted(run_dir.glob("events.out.tfevents.*")):
    kept = []
    try:
      # TF 2.21 has no TF2 reader of event records; tests/test_architecture.py fences it.
      for e in tf.compat.v1.train.summary_iterator(str(path)):
        if not e.HasField("summary") or (e.step <= last_step and not ended(e)):
          kept.append(e)
    except tf.errors.DataLossError:  # The killed process's last record, half written.
      pass
    tmp = path.with_name(path.name + ".tmp")
    with tf.io.TFRecordWriter(str(tmp)) as writer:
      for event in kept:
        writer.write(event.SerializeToString())
    tmp.replace(path)
