"""mpt: measure whether mixed precision makes a TensorFlow/Keras model train faster.

Command line: `python -m mpt` (mpt/main.py). In your own training script, any Keras
model (Functional, Sequential or subclassed), on Keras' TensorFlow backend:

  import mpt
  model.fit(train, epochs=3, validation_data=val,
            callbacks=mpt.callbacks("logs/my_run", batch_size=32))

writes the same run folder (TensorBoard tags, dtypes.json, summary.json) and prints the
same diagnosis at the end of each fit (mpt/train/script/library.py); one list serves any
number of fits. In your own loop, `mpt.track` (mpt/train/script/tracker.py):

  run = mpt.track("logs/my_loop", model, batch_size=32, optimizer=opt)
  step = run.step(train_step)
  with run:
    for images, labels in run.batches(train_ds):
      step(images, labels)
"""

__version__ = "0.1.0"


def _after_run(diagnose: bool):
  if not diagnose:
    return None
  from mpt.diagnose import diagnosis  # A wing: only when asked.
  return diagnosis.report_of  # Its failure is recorded (mpt/train/common/ending.py).


def callbacks(run_dir: str, *, batch_size: int, input_shape: tuple | None = None,
              diagnose: bool = True, **options) -> list:
  """Keras callbacks measuring a user's `model.fit` (any number of fits) into the run
  folder `run_dir`; `input_shape` (one example's) only where the model cannot tell it;
  options: warmup_steps=5, log_every=10, sample_every=1.0 (None: no sampler),
  profile_steps=(A, B) (a profiler trace of global steps A..B, after the warm-up),
  cost="auto" (after the first step, the step timed under each policy on the batch
  fed, the model left as it was: the speed verdict rests on it; "off": not timed),
  numerics="auto" (per-layer numerics on the batches fed, after the warm-up and at
  each fit's end: "auto" under a 16-bit global policy, "on", "off"), diagnose=True
  (the diagnosis after each fit). Nothing mpt does inside the fit can
  end it: a part that fails is one line and a `not_measured` entry."""
  from mpt.train.script import library  # TensorFlow: only when asked.
  opts = library.Options(batch_size, "fit", input_shape,
                         cost=options.pop("cost", "auto"))
  return library.make(run_dir, opts, after_run=_after_run(diagnose), **options)[0]


def track(run_dir: str, model, *, batch_size: int, optimizer=None,
          input_shape: tuple | None = None, diagnose: bool = True, **options):
  """mpt around your own training loop (mpt/train/script/tracker.py): `run.step(fn)` wraps
  the step (it may return any nest of tensors and numbers), `run.batches(data)` times
  the fetch, `run.end_epoch(logs)` ends an epoch, `with run:` opens and closes the run
  folder. `model`: one, or a tuple of models trained together (a GAN's two);
  `optimizer`: the loop's, one or a tuple (each one's loss scale and skipped steps
  are tracked); options as for `callbacks`."""
  from mpt.train.script import tracker
  return tracker.Tracker(run_dir, model, batch_size=batch_size, optimizer=optimizer,
                         input_shape=input_shape, after_run=_after_run(diagnose),
                         **options)
