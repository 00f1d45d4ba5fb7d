"""mpt's measurement around a user's own `model.fit` or training loop: the library side.

  import mpt
  model.fit(train, epochs=3, validation_data=val,
            callbacks=mpt.callbacks("logs/my_run", batch_size=32))

The callbacks give the run folder a training run of `python -m mpt.main` would have:
the same TensorBoard tags (train/ eval/ per epoch; perf/ precision/ util/ every
`log_every` steps; final/ at the end), the HParams session, dtypes.json from the
model's dtype inspection, summary.json (mpt/records/summary.py) and flags.txt
describing the run (model, policy, batch, image size), so that the diagnosis and
`--mode=compare` read it like any run. Any Keras model: Functional, Sequential or
subclassed (its input shape is read off its build; an unbuilt one is inspected after
its first step, when `fit` has built it).

One list serves any number of `fit`/`evaluate` calls: one run folder, its steps and
epochs continuing; each `fit` re-enters warm-up (it may trace again), and at each
`fit`'s end summary.json, runs.csv and the diagnosis are written for the whole run so
far (the last one is the run's). What a script's run cannot measure is recorded as such
(summary.json `not_measured`): the step's cost under each policy (mpt cannot rebuild a
script's model under another policy), and the data wait where `fit` runs several steps
per call. mpt/train/tracker.py drives the same callbacks from a user's own loop.
"""

import dataclasses
import pathlib
import time

import keras

from mpt import config
from mpt import files
from mpt.errors import UserError
from mpt.machine import hardware
from mpt.measure import dtypes as dtypes_lib
from mpt.measure import instrument
from mpt.measure import observe
from mpt.measure import sampler as sampler_lib
from mpt.records import runs as runs_lib
from mpt.records.summary import RunSummary
from mpt.train import callbacks as run_callbacks
from mpt.train import keras_fit
from mpt.train import precision
from mpt.train import record
from mpt.train.callbacks import StepCounter

NOT_REBUILT = ("a script's model cannot be rebuilt under another policy, so the step "
               "was not timed per policy before step 1 (`python -m mpt.main "
               "--model=pkg.mod:fn` does)")


def backend_check(api: str) -> None:
  """UserError unless Keras runs on TensorFlow: mpt measures TensorFlow's step."""
  if keras.backend.backend() != "tensorflow":
    raise UserError(f"{api}: Keras runs on the {keras.backend.backend()!r} backend here; "
                    "mpt measures TensorFlow only: set KERAS_BACKEND=tensorflow before "
                    "keras is imported")


@dataclasses.dataclass
class Options:
  """How a library run is measured (the keyword options of `mpt.callbacks`)."""
  batch_size: int
  loop: str = "fit"  # fit | custom (mpt.track)
  input_shape: tuple | None = None  # One example's; None: read off the model.
  optimizer: keras.optimizers.Optimizer | None = None  # None: the model's.


class RunFolder(keras.callbacks.Callback):
  """Opens the run (flags, dtypes, verdict, hparams) at the first `fit` and writes its
  record (summary, runs.csv, diagnosis) at the end of each."""

  def __init__(self, run_dir: pathlib.Path, timer: instrument.StepTimer,
               writer: instrument.ScalarWriter, sampler, opts: Options, after_run):
    super().__init__()
    self.run_dir, self.timer, self.writer, self.sampler = run_dir, timer, writer, sampler
    self.opts, self.after_run = opts, after_run
    self.report, self.verdict, self.cfg, self.fits = None, None, None, 0
    self.not_measured = {"cost": NOT_REBUILT}
    self.status = "completed"  # mpt.track: "interrupted" when the loop raised.
    self._segment, self._skipped_before = (None, 0, 0), 0
    self.start = time.perf_counter()

  @property
  def optimizer(self):
    return self.opts.optimizer or getattr(self.model, "optimizer", None)

  def skipped(self) -> int:
    """Steps whose update was skipped (non-finite gradients) over the whole run: each
    fit's optimizer counted from its iterations at that fit's start."""
    opt, steps0, iterations0 = self._segment
    if opt is None:
      return self._skipped_before
    return self._skipped_before + (self.timer.steps - steps0) - \
        (int(opt.iterations.numpy()) - iterations0)

  def _count_skips_from_here(self) -> None:
    """At a fit's start: a new optimizer (compiled again) counts from its own
    iterations, after the skips of the one before."""
    opt = self.optimizer
    if opt is not None and opt is not self._segment[0]:
      self._skipped_before = self.skipped()
      self._segment = (opt, self.timer.steps, int(opt.iterations.numpy()))

  def on_train_begin(self, logs=None):
    self.fits += 1
    self._count_skips_from_here()
    if self.cfg is None:
      self._open()
    else:
      self.timer.rewarm()
    if self.opts.loop == "fit":
      if getattr(self.model, "steps_per_execution", 1) == 1:
        keras_fit.fetch_through(self.model, self.timer.fetch)
        self.not_measured.pop("data_wait", None)
      else:
        self.not_measured["data_wait"] = (
            f"fit runs {self.model.steps_per_execution} steps per call "
            "(steps_per_execution): the batch fetch is not timed on its own")
    if self.sampler:
      self.sampler.start()

  def on_train_batch_end(self, batch, logs=None):
    if self.report is None:  # An unbuilt model: built by its first step.
      self._inspect()

  def _open(self) -> None:
    self.run_dir.mkdir(parents=True, exist_ok=True)
    policy = keras.mixed_precision.global_policy()
    shape = self.opts.input_shape or observe.input_shape(self.model)
    shape = tuple(shape[1:]) if shape and not self.opts.input_shape else shape
    self.cfg = dataclasses.replace(
        config.Config(), model=self.model.name, policy=policy.name, loop=self.opts.loop,
        batch_size=self.opts.batch_size, image_size=int((shape or (0,))[0] or 0),
        dataset="user", logdir=str(self.run_dir.parent), run_name=self.run_dir.name,
        batchnorm="keras")
    (self.run_dir / "flags.txt").write_text(config.to_flagfile(self.cfg))
    self.verdict = precision.check_speed(policy.name, precision.layer_classes(self.model))
    self.writer.write_opening(instrument.Opening(
        {"run/flags": "```\n" + config.to_flagfile(self.cfg) + "```",
         "precision/policy": precision.describe(policy)},
        run_callbacks.hparams(self.cfg)))
    if self.model.built or self.opts.input_shape:
      self._inspect()

  def _inspect(self) -> None:
    self.report = dtypes_lib.inspect_model(self.model, input_shape=self.opts.input_shape)
    if not self.cfg.image_size:  # Known now that the model is built: flags.txt says it.
      self.cfg = dataclasses.replace(self.cfg, image_size=self.report["input_shape"][0])
      (self.run_dir / "flags.txt").write_text(config.to_flagfile(self.cfg))
    files.write_json(self.run_dir / "dtypes.json", self.report)
    print(dtypes_lib.one_line(self.report), flush=True)
    self.writer.text("inspect/dtypes", dtypes_lib.format_table(self.report, True))
    self.writer.sources.flops_per_step = dtypes_lib.train_step_flops(
        self.report, self.opts.batch_size)

  def on_train_end(self, logs=None):
    if self.sampler:
      self.sampler.stop()
    summary = self._summary()
    self.writer.write_final(summary.to_dict())
    summary.write(self.run_dir / "summary.json")
    runs_lib.record(summary)  # <logdir>/runs.csv, as for any run.
    text = self.after_run(self.run_dir) if self.after_run else None
    if text:
      self.writer.text("diagnosis/report", text)
    self.writer.flush()  # Not closed: another fit may follow.
    what = f"fit {self.fits}, " if self.opts.loop == "fit" and self.fits > 1 else ""
    print(f"mpt: {self.status}: {self.run_dir}, {what}{summary.steps} steps, "
          f"{summary.ms_per_step or 0:.1f} ms/step; look: tensorboard --logdir "
          f"{self.run_dir.parent}", flush=True)

  def close_unused(self) -> None:
    """The run ends before its first step: nothing to record."""
    if self.sampler:
      self.sampler.stop()
    self.writer.flush()

  def _summary(self) -> RunSummary:
    cfg, timer = self.cfg, self.timer
    policy = keras.mixed_precision.global_policy()
    stats = timer.stats()
    return RunSummary(
        status=self.status, run_dir=str(self.run_dir), policy=policy.name,
        loop=self.opts.loop, model=cfg.model, dataset="user", batchnorm="keras",
        image_size=cfg.image_size, batch_size=self.opts.batch_size,
        compute_dtype=policy.compute_dtype, variable_dtype=policy.variable_dtype,
        epochs=timer.epochs_done, checkpoints=False,
        data_wait_share=None if "data_wait" in self.not_measured
        else stats.get("data_wait_share"),
        wall_s=round(time.perf_counter() - self.start, 3),
        flops_share_16bit=self.report["flops_share_16bit"] if self.report else None,
        util=self.sampler.stats() if self.sampler else None,
        hardware=hardware.facts(), policy_verdict=self.verdict,
        not_measured=dict(self.not_measured),
        **{**record.figures(timer, self.opts.batch_size,
                            self.writer.sources.flops_per_step, policy.compute_dtype,
                            self.optimizer),
           "skipped_steps": self.skipped()},
        **record.software())


def callbacks(run_dir: str, opts: Options, *, warmup_steps: int = 5,
              log_every: int = 10, sample_every: float | None = 1.0,
              after_run=None) -> list[keras.callbacks.Callback]:
  """The callbacks for a user's `model.fit` (or loop), writing the run folder `run_dir`
  (created; an existing run is refused, as mpt never overwrites one)."""
  backend_check("mpt.track" if opts.loop == "custom" else "mpt.callbacks")
  folder = pathlib.Path(run_dir).expanduser()
  if (folder / "summary.json").exists():
    raise FileExistsError(f"{folder} already holds a run (summary.json); "
                          "give a new folder")
  timer = instrument.StepTimer(warmup_steps)
  sampler = sampler_lib.Sampler(sample_every) if sample_every else None
  folder.mkdir(parents=True, exist_ok=True)
  writer = instrument.ScalarWriter(str(folder), timer, opts.batch_size, every=log_every,
                                   sources=instrument.Sources(sampler=sampler),
                                   opening=instrument.Opening(resumed=True))
  end = RunFolder(folder, timer, writer, sampler, opts, after_run)
  writer.sources.precision_state = lambda: {
      **precision.scalars(end.optimizer, timer.steps), "skipped_steps": end.skipped()}
  return [StepCounter(0), timer, writer, end]
