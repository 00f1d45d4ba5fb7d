"""mpt's measurement around a user's own `model.fit`: the library side of mpt.

  import mpt
  model.fit(train, epochs=3, validation_data=val,
            callbacks=mpt.callbacks("logs/my_run", batch_size=32))

The callbacks give the run folder a training run of `python -m mpt.main` would have:
the same TensorBoard tags (train/ eval/ per epoch; perf/ precision/ util/ every
`log_every` steps; final/ at the end), dtypes.json from the model's dtype inspection,
summary.json (mpt/records/summary.py) and flags.txt describing the run (model, policy,
batch, image size) so that the diagnosis and `--mode=compare` read it like any run.
At the end of training the diagnosis runs on the folder (`after_run`, which
mpt/__init__.py passes in: a wing does not import another wing) and its report goes
to the terminal and to the run's TensorBoard text.
"""

import dataclasses
import pathlib
import time

import keras

from mpt import config
from mpt.machine import hardware
from mpt.measure import dtypes as dtypes_lib
from mpt.measure import instrument
from mpt.measure import sampler as sampler_lib
from mpt import files
from mpt.records import runs as runs_lib
from mpt.records.summary import RunSummary
from mpt.train import precision
from mpt.train import record
from mpt.train.callbacks import StepCounter


class _RunFolder(keras.callbacks.Callback):
  """Opens the run (dtypes, flags, sampler) and closes it (summary, diagnosis)."""

  def __init__(self, run_dir: pathlib.Path, timer: instrument.StepTimer,
               writer: instrument.ScalarWriter, sampler, batch_size: int, after_run):
    super().__init__()
    self.run_dir, self.timer, self.writer, self.sampler = run_dir, timer, writer, sampler
    self.batch_size, self.after_run = batch_size, after_run
    self.report = None

  def on_train_begin(self, logs=None):
    self.start = time.perf_counter()
    self.run_dir.mkdir(parents=True, exist_ok=True)
    policy = keras.mixed_precision.global_policy()
    shape = self.model.inputs[0].shape if self.model.inputs else (None, 0)
    self.cfg = dataclasses.replace(
        config.Config(), model=self.model.name, policy=policy.name, loop="fit",
        batch_size=self.batch_size, image_size=int(shape[1] or 0), dataset="user",
        logdir=str(self.run_dir.parent), run_name=self.run_dir.name)
    (self.run_dir / "flags.txt").write_text(config.to_flagfile(self.cfg))
    self.report = dtypes_lib.inspect_model(self.model)
    files.write_json(self.run_dir / "dtypes.json", self.report)
    print(dtypes_lib.one_line(self.report), flush=True)
    self.writer.sources.flops_per_step = dtypes_lib.train_step_flops(self.report,
                                                                     self.batch_size)
    if self.sampler:
      self.sampler.start()

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
    self.writer.close()
    print(f"mpt: completed: {self.run_dir}, {summary.steps} steps, "
          f"{summary.ms_per_step or 0:.1f} ms/step; look: tensorboard --logdir "
          f"{self.run_dir.parent}", flush=True)

  def _summary(self) -> RunSummary:
    cfg, timer = self.cfg, self.timer
    policy = keras.mixed_precision.global_policy()
    return RunSummary(
        status="completed", run_dir=str(self.run_dir), policy=policy.name, loop="fit",
        model=cfg.model, dataset="user", image_size=cfg.image_size,
        batch_size=self.batch_size, compute_dtype=policy.compute_dtype,
        variable_dtype=policy.variable_dtype, epochs=timer.epochs_done,
        checkpoints=False, data_wait_share=None,
        wall_s=round(time.perf_counter() - self.start, 3),
        flops_share_16bit=self.report["flops_share_16bit"] if self.report else None,
        util=self.sampler.stats() if self.sampler else None,
        hardware=hardware.facts(),
        **record.figures(timer, self.batch_size, self.writer.sources.flops_per_step,
                         policy.compute_dtype, self.model.optimizer),
        **record.software())


def callbacks(run_dir: str, *, batch_size: int, warmup_steps: int = 5,
              log_every: int = 10, sample_every: float | None = 1.0,
              after_run=None) -> list[keras.callbacks.Callback]:
  """The callbacks for a user's `model.fit`, writing the run folder `run_dir`
  (created; an existing one is refused, as mpt never overwrites a run)."""
  folder = pathlib.Path(run_dir).expanduser()
  if (folder / "summary.json").exists():
    raise FileExistsError(f"{folder} already holds a run (summary.json); "
                          "give a new folder")
  timer = instrument.StepTimer(warmup_steps)
  sampler = sampler_lib.Sampler(sample_every) if sample_every else None
  folder.mkdir(parents=True, exist_ok=True)
  writer = instrument.ScalarWriter(str(folder), timer, batch_size, every=log_every,
                                   sources=instrument.Sources(sampler=sampler))
  writer.sources.precision_state = lambda: precision.scalars(
      getattr(writer.model, "optimizer", None), timer.steps)
  end = _RunFolder(folder, timer, writer, sampler, batch_size, after_run)
  return [StepCounter(0), timer, writer, end]

