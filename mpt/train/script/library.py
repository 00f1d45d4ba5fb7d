"""mpt's measurement around a user's own `model.fit` or training loop: the library side.

  import mpt
  model.fit(train, epochs=3, validation_data=val,
            callbacks=mpt.callbacks("logs/my_run", batch_size=32))

The run folder gets what a run of `python -m mpt.main` has (the same TensorBoard tags,
HParams, dtypes.json, summary.json with `program`: what the script ran,
mpt/records/program.py; no flags.txt, which would claim a replay), so that the
diagnosis and `--mode=compare` read it like any run. Any Keras model:
Functional, Sequential or subclassed, several inputs (list, dict, nested; strings and
integers too), or a model with no call() that holds its parts (a GAN, a VAE: each
part inspected). The inspection runs after the first step, on the first real batch
where mpt saw one (else on inputs made from what the model declares).

**mpt never ends the training it measures**: every part runs best effort
(mpt/train/common/besteffort.py), a failure is one line and a `not_measured` entry.

One list serves any number of `fit`/`evaluate` calls: one run folder, its steps and
epochs continuing; each `fit` re-enters warm-up (it may trace again), and at each
`fit`'s end the run is closed for the whole run so far (mpt/train/common/ending.py: the one
end of every run; the last one is the run's). mpt/train/script/tracker.py drives the same
callbacks from a user's own loop.
"""

import dataclasses
import pathlib
import time

import keras

from mpt.errors import UserError
from mpt.measure import instrument
from mpt.measure import observe
from mpt.measure import policies
from mpt.measure import profiler
from mpt.measure import sampler as sampler_lib
from mpt.records import program as program_lib
from mpt.records.summary import RunSummary
from mpt.train.common import besteffort
from mpt.train.common import ending
from mpt.train.common import figures as figures_lib
from mpt.train.common import keras_fit
from mpt.train.common import numerics as numerics_lib
from mpt.train.common import precision
from mpt.train.script import costing
from mpt.train.script import inspect
from mpt.train.script import watch
from mpt.train.common.besteffort import Guarded, Parts
from mpt.train.common.learnt import BeforeStep1

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
  optimizer: object = None  # The loop's optimizer(s); None: the model's.
  models: tuple = ()  # mpt.track's model(s); () for fit: the model fit runs.
  cost: str = "auto"  # auto: the step timed per policy after step 1 | off

  @property
  def api(self) -> str:
    return "mpt.track" if self.loop == "custom" else "mpt.callbacks"


class RunFolder(keras.callbacks.Callback):
  """Opens the run (inspection, verdict, hparams) at the first `fit` and closes it
  (mpt/train/common/ending.py) at the end of each."""

  def __init__(self, run_dir: pathlib.Path, timer: instrument.StepTimer,
               writer: instrument.ScalarWriter, sampler, opts: Options, after_run):
    super().__init__()
    self.run_dir, self.timer, self.writer, self.sampler = run_dir, timer, writer, sampler
    self.opts, self.after_run = opts, after_run
    self.not_measured = {}
    self.before = BeforeStep1()  # What costing.py and stepcost.py learn.
    self.parts = Parts(self.not_measured)
    self.optimizers = watch.Optimizers()
    self.program = program_lib.Program(api=opts.api, batch_size=opts.batch_size)
    self.batch = None  # The first batch fed (inspect.py's).
    self.latest = None  # The last batch fed.
    self.flops = None  # The step's FLOPs (inspect.py's CountStep).
    # mpt.track: how the loop ended (mpt/errors.py `ended`), and what happened.
    self.status, self.message = "completed", None
    self.start = time.perf_counter()

  @property
  def models(self) -> list[keras.Model]:
    return list(self.opts.models) or [self.model]

  @property
  def name(self) -> str:
    return "+".join(m.name for m in self.models)

  def on_train_begin(self, logs=None):
    first = not self.program.fits
    self.program.fits.append(program_lib.Fit(
        epochs=(self.params or {}).get("epochs") if self.opts.loop == "fit" else None,
        steps_per_epoch=(self.params or {}).get("steps")))
    self.parts.attempt("precision", self.optimizers.begin,
                       watch.find(self.models, self.opts.optimizer), self.timer.steps)
    if first:
      self.parts.attempt("writer", self.writer.write_opening, self._opening())
    else:
      self.timer.rewarm()
    if self.opts.loop == "fit":
      self.parts.attempt("data_wait", self._time_fetch)
    if self.sampler:
      self.parts.attempt("sampler", self.sampler.start)

  def _time_fetch(self) -> None:
    """Under fit, each batch's fetch timed as its step's data wait (and the first
    batch kept for the inspection)."""
    if getattr(self.model, "steps_per_execution", 1) != 1:
      self.not_measured["data_wait"] = (
          f"fit runs {self.model.steps_per_execution} steps per call "
          "(steps_per_execution): the batch fetch is not timed on its own")
      return
    besteffort.inject("data_wait")
    keras_fit.fetch_through(self.model, lambda it: self.keep(self.timer.fetch(it)))
    self.not_measured.pop("data_wait", None)

  def keep(self, batch):
    """The first batch seen (for the inspection) and the latest (the numerics');
    `batch` back."""
    self.batch = batch if self.batch is None else self.batch
    self.latest = batch
    return batch

  def on_epoch_end(self, epoch, logs=None):
    self.program.fits[-1].epochs_completed += 1

  def on_train_end(self, logs=None):
    self.parts.attempt("flops", self.flops.on_train_end)
    if self.sampler:
      self.parts.attempt("sampler", self.sampler.stop)
    summary = self._summary()
    ending.close(summary, self.run_dir, self.writer, self.after_run,
                 attempt=self.parts.attempt)
    self.parts.attempt("writer", self.writer.flush)  # Not closed: another fit may follow.
    fits = len(self.program.fits)
    what = f"fit {fits}" if self.opts.loop == "fit" and fits > 1 else ""
    ending.say_done(summary, self.run_dir, self.run_dir.parent, what)

  def close_unused(self) -> None:  # The run ended before its first step.
    if self.sampler:
      self.parts.attempt("sampler", self.sampler.stop)
    self.parts.attempt("writer", self.writer.flush)

  def _policy(self) -> keras.DTypePolicy:
    """The global policy (under a DTypePolicyMap: its default; the map's entries are
    the run's `layer_policy`)."""
    return policies.plain(keras.mixed_precision.global_policy())

  def policy_name(self) -> str:
    return self._policy().name

  def layer_classes(self) -> list[str]:
    return [c for m in self.models for c in precision.layer_classes(m)]

  def _opening(self) -> instrument.Opening:
    policy = self._policy()
    return instrument.Opening(
        {"run/program": f"{self.opts.api} in a script: model {self.name}, batch "
                        f"{self.opts.batch_size}",
         "precision/policy": precision.describe(policy)},
        {"api": self.opts.api, "policy": policy.name, "loop": self.opts.loop,
         "model": self.name, "batch_size": self.opts.batch_size})

  def _program(self) -> program_lib.Program:
    fit = self.program.fits[-1] if self.program.fits else None
    if fit is not None:
      fit.steps = self.timer.steps - sum(f.steps for f in self.program.fits[:-1])
    inputs = self.program.inputs or (self.before.report or {}).get("inputs") or {}
    return dataclasses.replace(
        self.program, policy=self._policy().name, inputs=inputs,
        models=[m.name for m in self.models],
        optimizers=self.parts.attempt("precision", self.optimizers.records,
                                      self.timer.steps, default=[]))

  def _summary(self) -> RunSummary:
    policy, timer = self._policy(), self.timer
    program = self._program()
    image_size = observe.image_size(program.inputs)
    found = figures_lib.figures(timer, self.opts.batch_size,
                                self.writer.sources.flops_per_step,
                                policy.compute_dtype, None,
                                images=image_size is not None)
    found.update(self.parts.attempt(
        "precision", lambda: {"loss_scale": self.optimizers.loss_scale(),
                              "skipped_steps": self.optimizers.skipped(timer.steps)},
        default={}))
    return RunSummary(
        status=self.status, message=self.message, run_dir=str(self.run_dir),
        api=self.opts.api, program=program, loop=self.opts.loop, model=self.name,
        dataset="user", batchnorm="keras", image_size=image_size,
        batch_size=self.opts.batch_size, epochs=timer.epochs_done,
        steps_per_epoch=program.fits[-1].steps_per_epoch if program.fits else None,
        checkpoints=False,
        data_wait_share=None if "data_wait" in self.not_measured
        else timer.stats().get("data_wait_share"),
        **self.before.fields(),
        layer_policy=policies.entries(keras.mixed_precision.global_policy()),
        not_measured=self.not_measured, **figures_lib.shared(
            policy, time.perf_counter() - self.start, self.before.report, self.sampler,
            self.run_dir, found, self.flops, self.parts.attempt))


def make(run_dir: str, opts: Options, *, warmup_steps: int = 5, log_every: int = 10,
         sample_every: float | None = 1.0, profile_steps: tuple[int, int] | None = None,
         after_run=None, numerics: str = "auto"
         ) -> tuple[list[keras.callbacks.Callback], RunFolder]:
  """(the callbacks for a user's `model.fit` or loop, in order; their RunFolder),
  writing the run folder `run_dir` (created; an existing run is refused, as mpt never
  overwrites one). Argument errors raise here, before training; nothing after does."""
  backend_check(opts.api)
  if opts.cost not in ("auto", "off"):
    raise UserError(f"{opts.api}: cost={opts.cost!r}: auto or off")
  folder = pathlib.Path(run_dir).expanduser()
  if (folder / "summary.json").exists():
    raise FileExistsError(f"{folder} already holds a run (summary.json); give a new "
                          "folder (several fits of one run: make the list once and "
                          "pass it to each fit)")
  if profile_steps is not None and (len(profile_steps) != 2 or
                                    not warmup_steps < profile_steps[0] <= profile_steps[1]):
    raise UserError(f"{opts.api}: profile_steps={profile_steps!r} must be (first, last) "
                    f"steps after the {warmup_steps} warm-up steps, first <= last")
  timer = instrument.StepTimer(warmup_steps)
  sampler = sampler_lib.Sampler(sample_every) if sample_every else None
  folder.mkdir(parents=True, exist_ok=True)
  writer = instrument.ScalarWriter(str(folder), timer, opts.batch_size, every=log_every,
                                   sources=instrument.Sources(sampler=sampler),
                                   opening=instrument.Opening(resumed=True))
  end = RunFolder(folder, timer, writer, sampler, opts, after_run)
  parts, counter = end.parts, instrument.StepCounter(0)
  writer.sources.precision_state = lambda: parts.attempt(
      "precision", end.optimizers.scalars, timer.steps, default={})
  found = [counter, Guarded(timer, "timer", parts), Guarded(writer, "writer", parts)]
  if profile_steps:
    window = profiler.ProfileWindow(str(folder), *profile_steps,
                                    step=lambda: counter.current,
                                    marker=keras_fit.step_marker)
    found.append(Guarded(window, "profile", parts))
  found += numerics_lib.for_library(end, lambda: counter.done, warmup_steps, numerics)
  return found + [Guarded(inspect.Inspect(end), "inspect", parts),
                  Guarded(costing.StepCost(end), "cost", parts),
                  Guarded(end, "run", parts)], end
