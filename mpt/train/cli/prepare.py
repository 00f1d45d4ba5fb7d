"""Everything a training run does before its first step: `prepare(cfg)` -> `Run`.

`prepare` reads as the run happens: the checks that can fail on bad input come
before any work (UserError); what the run learns before step 1 is made once by
mpt/train/before_step1/measure.py (one `BeforeStep1`), before the run's model is built.

`Run` is the one object the rest of the run reads: the callbacks (callbacks.py), the
loop and the ending (run.py), and summary.json (record.py).
"""

import dataclasses
import pathlib
import tempfile
import time
from typing import Any

from absl import logging
import keras
import tensorflow as tf

from mpt import config
from mpt import files
from mpt import injection
from mpt import speech
from mpt import supervisor
from mpt.errors import UserError
from mpt.measure import dtypes as dtypes_lib
from mpt.measure import policies
from mpt.measure import profiler
from mpt.measure import sampler as sampler_lib
from mpt.records import rundir
from mpt.train.cli import checkpoint
from mpt.train.cli import data as data_lib
from mpt.train.cli import distribute
from mpt.train.common import precision
from mpt.train.before_step1 import measure
from mpt.train.common.learnt import BeforeStep1
from mpt.train.common.model import build_model
from mpt.train.common.plan import Plan


@dataclasses.dataclass
class Run:
  """One training run as `prepare` leaves it before its first step."""
  cfg: Plan  # As the run trains: resumed, --onednn and --policy=auto settled.
  dist: distribute.Setup
  data: data_lib.Data
  policy: keras.DTypePolicy
  # The run folder (a non-chief worker: the folder it resumes, else its scratch
  # folder), and where this process writes (a non-chief worker: its scratch folder).
  run_dir: pathlib.Path
  out_dir: pathlib.Path
  model: keras.Model
  optimizer: keras.optimizers.Optimizer
  ckpt: checkpoint.Checkpointer
  start_step: int  # The global step the run starts at (> 0: resumed).
  prior: dict[str, Any]  # The resumed checkpoint's state ({} for a fresh run).
  started: float  # time.perf_counter() when the run began.
  window: tuple[int, int] | None  # --profile_steps (None: no profile, or not chief).
  sampler: sampler_lib.Sampler | None  # The chief's, with --instrument.
  # What was learnt before step 1 (mpt/train/before_step1/), its dtype report and
  # memory plan included.
  before: BeforeStep1

  @property
  def report(self) -> dict[str, Any] | None:
    """The dtype report the run records (None: --noinstrument)."""
    return self.before.report if self.cfg.instrument else None

  def wall_s(self) -> float:
    """The run's wall time so far, its attempts before a resume included."""
    return self.prior.get("wall_s", 0.0) + time.perf_counter() - self.started


def resume_config(cfg: config.Config) -> config.Config:
  """The config a run folder was started with, to continue it (`--resume`)."""
  flags_txt = pathlib.Path(cfg.resume).expanduser() / "flags.txt"
  if not flags_txt.is_file():
    raise UserError(f"--resume={cfg.resume!r} is not a run folder (no flags.txt)")
  saved = config.from_flagfile(flags_txt.read_text())
  if not saved.checkpoint:
    raise UserError(f"--resume={cfg.resume!r}: that run was made with "
                    "--checkpoint=false and has no checkpoint to resume from")
  return dataclasses.replace(saved, resume=cfg.resume, verbose=cfg.verbose)


def prepare(cfg: config.Config) -> Run:
  """Everything before the first step; UserError before any work where possible."""
  started = time.perf_counter()
  cfg = Plan.of(resume_config(cfg) if cfg.resume else cfg)
  dist = _start(cfg)
  data = data_lib.load(cfg)
  logging.info("data: %s, %d train / %d val images, %d classes, %d skipped", data.source,
               data.n_train, data.n_val, len(data.class_names), len(data.skipped_files))
  before = measure.before_step1(cfg, data, dist.workers)
  cfg = before.cfg
  policy = precision.set_policy(cfg.policy)
  print(precision.describe(policy), flush=True)
  window = profiler.window(cfg.profile, cfg.warmup_steps, cfg.epochs * data.steps_per_epoch,
                           gpu=bool(tf.config.list_logical_devices("GPU")))
  run_dir, out_dir = _folders(cfg, dist)
  if not dist.is_chief:
    cfg = dataclasses.replace(cfg, verbose=0, profile_steps="off")
    window = None
    print(f"mpt: {dist.task} is not the chief: the chief writes the run folder",
          flush=True)
  with dist.strategy.scope():  # Variables become mirrored (or stay local: default).
    model = build_model(cfg, len(data.class_names), dist.replicas)
    optimizer = precision.make_optimizer(cfg.policy, cfg.learning_rate, cfg.loss_scale,
                                         scaled=cfg.scales_loss)
    optimizer.build(model.trainable_variables)  # Its slots must exist to be restored.
  if cfg.layer_policy and dist.is_chief:  # The plan in the form a script applies.
    _write_plan(cfg, model, out_dir, before.choice is not None)
  measure.with_model(before, model, cfg.epochs * data.steps_per_epoch, dist,
                     remove=run_dir if not cfg.resume and dist.is_chief else None)
  ckpt = checkpoint.Checkpointer(run_dir, model, optimizer, cfg.keep_checkpoints,
                                 write_dir=out_dir)
  start_step, prior = _restore(cfg, ckpt, run_dir, dist)
  if cfg.instrument:
    files.write_json(out_dir / "dtypes.json", before.report)
    if dist.is_chief:
      print(dtypes_lib.one_line(before.report), flush=True)
  sampler = sampler_lib.Sampler(cfg.sample_every, state=prior.get("sampler")) \
      if cfg.instrument and dist.is_chief else None
  return Run(cfg=cfg, dist=dist, data=data, policy=policy, run_dir=run_dir,
             out_dir=out_dir, model=model, optimizer=optimizer, ckpt=ckpt,
             start_step=start_step, prior=prior, started=started, window=window,
             sampler=sampler, before=before)


def _write_plan(cfg: config.Config, model: keras.Model, out_dir: pathlib.Path,
                auto: bool) -> None:
  """The run's --layer_policy as the DTypePolicyMap a script applies, said."""
  found = policies.map_of(model, list(cfg.layers))
  where = policies.write_map(out_dir, found, f"--policy={cfg.policy} --layer_policy="
                             f"{cfg.layer_policy}" + (" (--policy=auto)" if auto else ""))
  print(speech.plan_line(where, found[1]), flush=True)


def _start(cfg: Plan) -> distribute.Setup:
  """The checks of the run's input (its flags: resolved in its Plan), the strategy
  and a fresh TF state."""
  injection.injected_faults()  # A malformed MPT_INJECT_FAULT is bad input, said now.
  injection.kill_at()  # So is a malformed MPT_KILL_AT.
  # First: devices and collectives can only be set up before TF's runtime starts.
  dist = distribute.setup(cfg)
  distribute.check_batch(cfg, dist)
  fresh_start(cfg, dist.is_chief)
  if cfg.deterministic:
    tf.config.experimental.enable_op_determinism()
  tf.config.experimental.enable_tensor_float_32_execution(cfg.tf32)
  if cfg.policy == "auto" and dist.workers > 1:
    raise UserError("--policy=auto times steps on one machine; with "
                    "--strategy=multi_worker each worker could choose differently: "
                    "give the policy")
  if dist.replicas > 1 or cfg.strategy != "default":  # One device: nothing to say.
    print(f"mpt: {dist.describe()}", flush=True)
  return dist


def fresh_start(cfg: config.Config, chief: bool = True) -> None:
  """The log root checked (by the chief: it writes there), and Keras' state fresh, as
  a run starts (`--mode=inspect` too, mpt/train/cli/dryrun.py)."""
  if chief:
    rundir.check_root(cfg)
  # Fresh Keras state (layer names, graph) when runs share a process (tests, a
  # notebook). Without Python's full collection, which in a long-lived process holding
  # many models takes longer than a tiny run (automatic collection still runs).
  keras.backend.clear_session(free_memory=False)
  keras.utils.set_random_seed(cfg.seed)


def _folders(cfg: config.Config,
             dist: distribute.Setup) -> tuple[pathlib.Path, pathlib.Path]:
  """(the run folder, the folder this process writes): a new run's folder is created
  with its flags.txt, a resumed run's is `--resume`."""
  if cfg.resume:
    run_dir = pathlib.Path(cfg.resume).expanduser()
  elif dist.is_chief:
    run_dir = rundir.create(cfg)
    (run_dir / "flags.txt").write_text(config.to_flagfile(cfg))
  if dist.is_chief:
    supervisor.note_run_dir(run_dir)
    return run_dir, run_dir
  # Only the chief writes the run folder; another worker writes into a scratch folder
  # deleted at its end (it must still take part in every checkpoint save).
  out_dir = pathlib.Path(tempfile.mkdtemp(prefix=f"mpt-{dist.task.replace(':', '')}-"))
  return (run_dir if cfg.resume else out_dir), out_dir


def _restore(cfg: config.Config, ckpt: checkpoint.Checkpointer, run_dir: pathlib.Path,
             dist: distribute.Setup) -> tuple[int, dict[str, Any]]:
  """(the step the run starts at, the state its checkpoint stored); (0, {}) for a new
  run."""
  if not cfg.resume:
    return 0, {}
  start_step, _, prior = ckpt.restore()
  if dist.is_chief:
    checkpoint.prune_events(run_dir, start_step)
  print(f"mpt: resuming {run_dir} at step {start_step}", flush=True)
  return start_step, prior
