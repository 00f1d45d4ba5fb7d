"""A run's numerics (mpt/measure/numerics.py, record mpt/records/numerics.py): when
they are sampled, on which batches, and where they are said and written.

`--numerics=auto` samples them in a run that computes in a 16-bit dtype (its policy
or a --layer_policy) and in `--mode=inspect`; `on` in every run, `off` never. A
training run takes two samples of BATCHES real batches: after the step that ends
warm-up (its weights have moved off their initial values, its loss scale has
settled), and at the end however the run ends (a diverged run's, where it matters
most: its loss-scaling optimizer skipped the non-finite updates, so the weights are
the last finite ones). The model as built gets one sample for `--mode=inspect` and
`--policy=auto`. Each sample rewrites numerics.json in the run folder and is said in
one line; the table goes into the run's TensorBoard text at the end.

Best effort everywhere, in mpt's own runs as in a user's `fit` (mpt/train/script/library.py):
a sample that fails is one line and a `not_measured` entry in numerics.json, and the
training goes on.
"""

import dataclasses
import pathlib
from typing import Any, Callable

import keras

from mpt import config
from mpt.measure import numerics as measure
from mpt.measure import observe
from mpt.measure import policies
from mpt.records import numerics as records
from mpt.train.common import besteffort
from mpt.train.common import keras_fit
from mpt.train.common import overflow
from mpt.train.common import precision
from mpt.train.common import steps as steps_lib
from mpt.train.common.plan import Plan

BATCHES = 2


def wanted(cfg: config.Config, inspect: bool = False) -> bool:
  """Whether `cfg`'s run samples its numerics."""
  if cfg.numerics != "auto":
    return cfg.numerics == "on"
  return inspect or Plan.of(cfg).sixteen is not None


@dataclasses.dataclass
class Source:
  """What a sample reads, each when it is taken: the model, a few real batches of
  (x, y) from a step on, the loss of (x, y, prediction) (None: no gradients), the
  loss scale now."""
  model: Callable[[], keras.Model]
  batches: Callable[[int], list[tuple[Any, Any]]]
  loss: Callable[[], measure.Loss | None]
  scale: Callable[[], float | None]


class Watch(keras.callbacks.Callback):
  """Samples after the step `at_step` and at `finish()` (inside a user's fit: at each
  fit's end, `ends_fit`); writes numerics.json to `run_dir` after each, and the table
  as `writer`'s text at the end. `parts` records what fails (default: its own, into
  numerics.json's `not_measured`)."""

  def __init__(self, source: Source, found: records.Numerics, run_dir: pathlib.Path,
               at_step: int, done: Callable[[], int],
               parts: besteffort.Parts | None = None, writer=None,
               ends_fit: bool = False):
    super().__init__()
    self.source, self.found, self.run_dir = source, found, run_dir
    self.at_step, self.done, self.writer, self.ends_fit = at_step, done, writer, ends_fit
    self.parts = parts or besteffort.Parts(found.not_measured)
    self._scale: float | None = None  # The loss scale after the last step.

  def on_train_begin(self, logs=None):
    self._scale = self.parts.attempt("overflow", self.source.scale)

  def on_train_batch_begin(self, batch, logs=None):
    # A script's optimizers are known from its first step on: the scale step 1 runs
    # at, read before it (a skip at step 1 is replayed too).
    if self._scale is None:
      self._scale = self.parts.attempt("overflow", self.source.scale)

  def on_train_batch_end(self, batch, logs=None):
    self.parts.attempt("overflow", self._replay_if_skipped)
    if not self.found.samples and self.done() >= self.at_step:
      self.take()

  def _replay_if_skipped(self) -> None:
    """A step whose loss scale fell was skipped (non-finite gradients): its batch
    replayed once (mpt/train/common/overflow.py), at the scale it ran at."""
    scale = self.source.scale()
    before, self._scale = self._scale, scale
    if before is None or scale is None or scale >= before:
      return
    step = self.done()
    if len(self.found.overflows) >= overflow.MAX_REPLAYS:
      if not self.found.skipped_not_replayed:
        print(f"mpt: step {step} skipped; {overflow.MAX_REPLAYS} skipped steps were "
              "replayed already, the rest are counted only", flush=True)
      self.found.skipped_not_replayed += 1
      return
    x, y = self.source.batches(step - 1)[0]
    found = overflow.replay(self.source.model(), x, y, self.source.loss(), before, step)
    self.found.overflows.append(found)
    records.write(self.run_dir, self.found)
    print(f"mpt: {overflow.describe(found)}", flush=True)

  def on_train_end(self, logs=None):
    if self.ends_fit:
      self.finish()

  def take(self) -> None:
    """A sample now (best effort)."""
    self.parts.attempt("numerics", self._take)

  def _take(self) -> None:
    step = self.done()
    if any(s.step == step for s in self.found.samples):
      return
    sample = measure.sample(self.source.model(), self.source.batches(step),
                            self.source.loss(), step, self.source.scale(),
                            ops=keras_fit.eager_ops)
    self.found.samples.append(sample)
    self.found.seconds = round(sum(s.seconds for s in self.found.samples), 3)
    records.write(self.run_dir, self.found)
    print(records.one_line(sample, self.found.policy), flush=True)

  def finish(self) -> records.Numerics:
    """The end's sample, numerics.json, and the table as the writer's text."""
    self.take()
    self.parts.attempt("numerics", records.write, self.run_dir, self.found)
    if self.writer is not None and self.found.samples:
      self.parts.attempt("writer", self.writer.text, "numerics/layers",
                         records.format_table(self.found))
    if self.writer is not None and self.found.overflows:  # Each skip's cause.
      lines = [f"- {overflow.describe(o)}" for o in self.found.overflows]
      if self.found.skipped_not_replayed:
        lines.append(f"- {self.found.skipped_not_replayed} later skipped steps not "
                     "replayed")
      self.parts.attempt("writer", self.writer.text, "numerics/skipped",
                         "\n".join(lines))
    return self.found


def of_data(data) -> Callable[[int], list]:
  """The run's own batches from a step on (a fresh pipeline: the training stream is
  a pure function of the seed, mpt/train/cli/data.py)."""
  return lambda step: list(data.train_from(step).take(BATCHES))


def sparse_loss(loss: keras.losses.Loss) -> measure.Loss:
  return lambda x, y, prediction: loss(y, prediction)


def for_run(run, loss: keras.losses.Loss, done: Callable[[], int],
            writer=None) -> Watch | None:
  """The watch of an mpt run (mpt/train/cli/prepare.py's Run; `writer`: its TensorBoard
  writer), or None where it takes none (not wanted, or a model on several replicas:
  a sample reads one)."""
  cfg = run.cfg
  if not wanted(cfg) or not run.dist.is_chief:
    return None
  found = records.Numerics(cfg.policy, cfg.loss_scale if cfg.scales_loss else "none")
  if run.dist.replicas > 1:
    found.not_measured["numerics"] = (
        f"the model runs on {run.dist.replicas} replicas: a sample reads one device's "
        "model (run with one device to see it)")
    records.write(run.out_dir, found)
    return None
  _carried(found, run.out_dir, run.start_step)
  source = Source(lambda: run.model, of_data(run.data), lambda: sparse_loss(loss),
                  lambda: precision.loss_scale(run.optimizer)
                  if cfg.scales_loss else None)
  return Watch(source, found, run.out_dir, run.start_step + cfg.warmup_steps + 1, done,
               writer=writer)


def _carried(found: records.Numerics, run_dir: pathlib.Path, start_step: int) -> None:
  """A resumed run keeps what its folder's numerics.json holds of the steps its
  checkpoint kept (samples, skipped steps replayed): it reports them as a run never
  stopped would; the steps after them run again, and are sampled and replayed again."""
  prior = records.read(run_dir) if start_step else None
  if prior is None:
    return
  found.samples = [s for s in prior.samples if s.step <= start_step]
  found.overflows = [o for o in prior.overflows if o.step <= start_step]
  found.seconds = round(sum(s.seconds for s in found.samples), 3)


def before_training(cfg: config.Config, model: keras.Model, batches: list,
                    loss: keras.losses.Loss) -> records.Numerics:
  """One sample of the model as built (`--mode=inspect`, `--policy=auto`), said; a
  failure is said and left in its `not_measured`."""
  found = records.Numerics(cfg.policy, cfg.loss_scale)
  scale = records.DYNAMIC_START if cfg.loss_scale == "dynamic" else float(cfg.loss_scale)
  sample = besteffort.Parts(found.not_measured).attempt(
      "numerics", measure.sample, model, batches, sparse_loss(loss), 0, scale,
      ops=keras_fit.eager_ops)
  if sample is not None:
    found.samples.append(sample)
    found.seconds = sample.seconds
    print(records.one_line(sample, cfg.policy), flush=True)
  return found


def unsafe(cfg: config.Config, model: keras.Model, data) -> dict[str, str]:
  """For --policy=auto: {policy: why its numerics rule it out} from one sample of the
  model as built on the run's first batches: mixed_float16 where a layer's outputs
  leave float16's range (they would be inf). {} where none does, or where the
  sample failed (said)."""
  found = before_training(cfg, model, of_data(data)(0), steps_lib.make_loss())
  over, keep = records.overflow_keep([r for r in records.worst(found) if not r.pinned])
  if not over:
    return {}
  names = ", ".join(f"{r.name} ({r.in_op} inside it: {r.in_max:.3g})" if r.inside_only()
                    else f"{r.name} ({r.out_max:.3g})" for r in over[:3])
  pattern = records.layer_pattern(keep)
  return {"mixed_float16": f"numerics: {names} above float16's {records.F16_MAX:g} "
                           f"(--layer_policy='{pattern}=float32' keeps them and their "
                           "readers in float32; or mixed_bfloat16)"}


def _fit_loss(model: keras.Model, api: str) -> measure.Loss | None:
  """The loss `fit` trains a compiled model with (mpt.track's loop: its own, unknown:
  no gradients)."""
  if api != "mpt.callbacks" or getattr(model, "loss", None) is None:
    return None
  return lambda x, y, prediction: model.compute_loss(x=x, y=y, y_pred=prediction)


def for_library(end, done: Callable[[], int], warmup_steps: int,
                when: str) -> list[keras.callbacks.Callback]:
  """mpt.callbacks' and mpt.track's watch (`end`: their RunFolder, mpt/train/script/library.py)
  on the user's own model and the last batch it was fed: [] unless `when` ("auto":
  a 16-bit global policy) asks for it. Its failures are the run's `not_measured`."""
  if when not in ("auto", "on", "off"):
    raise ValueError(f"numerics={when!r}: auto, on or off")
  policy = keras.mixed_precision.global_policy()
  if when == "off" or (when == "auto" and policies.sixteen(policy) is None):
    return []

  def model() -> keras.Model:
    if len(end.models) != 1 or not observe.has_call(end.models[0]):
      raise ValueError(f"{end.name} has no one call() to watch (its parts train in "
                       "its own step): numerics are sampled on a single callable model")
    return end.models[0]

  def batches(step: int) -> list:
    if end.latest is None:
      raise ValueError("no batch seen (the fetch is not timed here)")
    if end.opts.loop != "fit":
      return [(end.latest, None)]
    x, y, _ = keras.utils.unpack_x_y_sample_weight(end.latest)
    return [(x, y)]

  name = policies.plain(policy).name  # A map's default.
  found = records.Numerics(name, "dynamic" if config.scales(name) else "none")
  source = Source(model, batches, lambda: _fit_loss(model(), end.opts.api),
                  end.optimizers.loss_scale)
  watch = Watch(source, found, end.run_dir, warmup_steps + 1, done, end.parts,
                end.writer, ends_fit=True)
  return [besteffort.Guarded(watch, "numerics", end.parts)]
