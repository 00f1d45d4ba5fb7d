"""mpt: measure whether mixed precision makes a TensorFlow/Keras model train faster.

Command line: `python -m mpt.main` (mpt/main.py). In your own training script:

  import mpt
  model.fit(train, epochs=3, validation_data=val,
            callbacks=mpt.callbacks("logs/my_run", batch_size=32))

writes the same run folder (TensorBoard tags, dtypes.json, summary.json) and prints the
same diagnosis at the end (mpt/train/library.py).
"""

__version__ = "0.1.0"


def callbacks(run_dir: str, *, batch_size: int, **options) -> list:
  """Keras callbacks measuring a user's `model.fit` into the run folder `run_dir`;
  options: warmup_steps=5, log_every=10, sample_every=1.0 (None: no sampler),
  diagnose=True (the diagnosis at the end)."""
  from mpt.train import library  # TensorFlow: only when asked.
  after_run = None
  if options.pop("diagnose", True):
    from mpt.diagnose import diagnosis
    after_run = diagnosis.after_run
  return library.callbacks(run_dir, batch_size=batch_size, after_run=after_run,
                           **options)
