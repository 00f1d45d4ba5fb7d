"""One training run, start to finish: `train_and_evaluate(cfg)` -> summary dict.
(`--mode=inspect`, the same model built without training, is mpt/train/inspect.py.)

Checks the config, creates the tf.distribute strategy (mpt/train/distribute.py), sets
the precision policy, loads the data, builds the model and the optimizer under the
strategy's scope (restored from the latest checkpoint with `--resume`), inspects the
model's dtypes, runs the chosen loop with the run's callbacks (mpt/train/callbacks.py)
and a utilisation sampler, and writes the run folder: event files, `flags.txt` (a
flagfile that replays the run), `dtypes.json`, `checkpoints/` and `summary.json` (the
chief alone, under multi_worker), and appends the run's line to `<logdir>/runs.csv`
(mpt/records/runs.py).

However the loop ends, events are flushed and summary.json is written, with status
`completed`; `interrupted` (Ctrl-C or SIGTERM: a checkpoint is saved first, exit 130);
`diverged` (NaN/Inf loss or a collapsed loss scale: the last good checkpoint is left
as it was, exit 3); or `failed` (a bug: the traceback follows). Then `after_run` (the
diagnosis, passed in by mpt/main.py) reads the folder; its Markdown goes into the
run's TensorBoard text.
"""

import dataclasses
import pathlib
import shutil
import sys
import tempfile
import time
from typing import Any, Callable

from absl import logging
import keras
import numpy as np
import tensorflow as tf

from mpt import config
from mpt import injection
from mpt import models
from mpt import supervisor
from mpt.models import fused_bn
from mpt.errors import UserError
from mpt.measure import dtypes as dtypes_lib
from mpt.measure import memory
from mpt.measure import profiler
from mpt.measure import sampler as sampler_lib
from mpt.records import rundir
from mpt.records import runs as runs_lib
from mpt.records.cost import Cost, OnednnChoice
from mpt.train import autopolicy
from mpt.train import callbacks as callbacks_lib
from mpt.train import checkpoint
from mpt.train import cost as cost_lib
from mpt.train import data as data_lib
from mpt.train import distribute
from mpt.train import guards
from mpt.train import keras_fit
from mpt.train import loops
from mpt.train import onednn_choice
from mpt.train import precision
from mpt.train import preflight
from mpt.train import steps as steps_lib
from mpt.train import summary as summary_lib

AfterRun = Callable[[pathlib.Path], str | None]


@dataclasses.dataclass
class Prepared:
  """What `_prepare` settles before the model is built."""
  cfg: config.Config
  policy: keras.DTypePolicy
  data: data_lib.Data
  window: Any
  fault_window: tuple[int, int] | None
  dist: distribute.Setup
  choice: dict[str, Any] | None  # --policy=auto's record.
  cost: Cost | None  # This model's step per policy (mpt/train/cost.py).
  onednn: OnednnChoice  # TF's oneDNN rewrite, and why.


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


def _prepare(cfg: config.Config):
  """Everything before the first step; UserError before any work where possible."""
  config.validate(cfg)
  injection.injected_faults()  # A malformed MPT_INJECT_FAULT is bad input, said now.
  injection.kill_at()  # So is a malformed MPT_KILL_AT.
  # First: devices and collectives can only be set up before TF's runtime starts.
  dist = distribute.setup(cfg)
  distribute.check_batch(cfg, dist)
  models.parse_opts(cfg.model, cfg.model_opts)  # Checks the name and the options.
  if dist.is_chief:
    rundir.check_root(cfg)
  profiler.parse_window(cfg.profile_steps, cfg.warmup_steps, 10**12)  # Syntax, early.
  fault_window = config.parse_steps(cfg.fault_steps, "fault_steps")
  keras.backend.clear_session()  # Fresh graph state when runs share a process (tests).
  keras.utils.set_random_seed(cfg.seed)
  if cfg.deterministic:
    tf.config.experimental.enable_op_determinism()
  tf.config.experimental.enable_tensor_float_32_execution(cfg.tf32)
  if cfg.policy == "auto" and dist.workers > 1:
    raise UserError("--policy=auto times steps on one machine; with "
                    "--strategy=multi_worker each worker could choose differently: "
                    "give the policy")
  if dist.replicas > 1 or cfg.strategy != "default":  # One device: nothing to say.
    print(f"mpt: {dist.describe()}", flush=True)
  data = data_lib.load(cfg)
  logging.info("data: %s, %d train / %d val images, %d classes, %d skipped files",
               data.source, data.n_train, data.n_val, len(data.class_names),
               len(data.skipped_files))
  onednn, cost = _before_step_one(cfg, data, dist)
  # flags.txt records the rewrite's state the run trains with, so that --resume and a
  # replayed flags.txt run under it (runs that differ in it are not the same config).
  cfg = dataclasses.replace(cfg, onednn=onednn.label() if onednn.on is not None
                            else cfg.onednn)
  choice = None
  if cfg.policy == "auto":
    chosen, choice = autopolicy.choose(
        cfg, data, dist.strategy,
        lambda: build_model(cfg, len(data.class_names), dist.replicas),
        predicted=cost.predicted() if cost else None)
    print(f"mpt: --policy=auto: {chosen} was fastest here\n"
          f"{autopolicy.format_table(choice)}", flush=True)
    cfg = dataclasses.replace(cfg, policy=chosen)
    keras.utils.set_random_seed(cfg.seed)  # The run starts as a fresh one would.
  policy = precision.set_policy(cfg.policy)
  print(precision.describe(policy), flush=True)
  window = profiler.parse_window(cfg.profile_steps, cfg.warmup_steps,
                                 cfg.epochs * data.steps_per_epoch)
  return Prepared(cfg, policy, data, window, fault_window, dist, choice, cost, onednn)


def _before_step_one(cfg: config.Config, data: data_lib.Data, dist: distribute.Setup):
  """(TF's oneDNN rewrite here and why, this model's step cost per policy or None),
  each said in one line."""
  onednn = onednn_choice.current(keras_fit.onednn_rewrite_on())
  if dist.workers > 1:
    print("mpt: note: the step's cost per policy was not measured: each worker of a "
          "cluster would measure on its own", flush=True)
    return onednn, None
  build = lambda: build_model(cfg, len(data.class_names))
  found, note = cost_lib.for_run(cfg, build, cfg.epochs * data.steps_per_epoch,
                                 fits=lambda: preflight.will_not_fit(cfg, build))
  keras.utils.set_random_seed(cfg.seed)  # The run starts as a fresh one would.
  if note:
    print(f"mpt: note: {note}", flush=True)
  if found:
    print(cost_lib.one_line(found, onednn.short()), flush=True)
  return onednn, found


def build_model(cfg: config.Config, n_classes: int, replicas: int = 1) -> keras.Model:
  """The --model variant for --image_size inputs (under the caller's strategy scope),
  with --batchnorm's layers."""
  size = cfg.image_size
  synchronized = cfg.sync_batchnorm and replicas > 1
  model = models.build(cfg.model, (size, size, 3), n_classes,
                       run_options={"bn_momentum": cfg.bn_momentum,
                                    "bn_synchronized": synchronized},
                       **models.parse_opts(cfg.model, cfg.model_opts))
  if cfg.batchnorm == "fused":
    if synchronized:  # The fused kernel has no cross-replica statistics.
      print(f"mpt: --batchnorm=fused: BatchNorm is synchronized across {replicas} "
            "replicas, which only Keras' layer does; keeping Keras' layer", flush=True)
      return model
    model, _, kept = fused_bn.with_fused_batchnorm(model)
    if kept:
      print(f"mpt: --batchnorm=fused: {kept} BatchNormalization layer(s) kept as "
            "Keras' (not over the last axis, or without center/scale)", flush=True)
  return model


def train_and_evaluate(cfg: config.Config,
                       after_run: AfterRun | None = None) -> dict[str, Any]:
  """Runs one training run as `cfg` says; returns what it wrote to summary.json."""
  start = time.perf_counter()
  if cfg.resume:
    cfg = resume_config(cfg)
  ready = _prepare(cfg)
  cfg, policy, data, window, fault_window, dist, choice = (
      ready.cfg, ready.policy, ready.data, ready.window, ready.fault_window, ready.dist,
      ready.choice)
  if cfg.resume:
    run_dir = pathlib.Path(cfg.resume).expanduser()
  elif dist.is_chief:
    run_dir = rundir.create(cfg)
    (run_dir / "flags.txt").write_text(config.to_flagfile(cfg))
  if dist.is_chief:
    supervisor.note_run_dir(run_dir)
  # Only the chief writes the run folder; another worker writes into a scratch folder
  # deleted at its end (it must still take part in every checkpoint save).
  out_dir = run_dir if dist.is_chief else pathlib.Path(
      tempfile.mkdtemp(prefix=f"mpt-{dist.task.replace(':', '')}-"))
  if not dist.is_chief:
    run_dir = run_dir if cfg.resume else out_dir
    cfg = dataclasses.replace(cfg, verbose=0, profile_steps="")
    window = None
    print(f"mpt: {dist.task} is not the chief: the chief writes the run folder",
          flush=True)
  with dist.strategy.scope():  # Variables become mirrored (or stay local: default).
    model = build_model(cfg, len(data.class_names), dist.replicas)
    optimizer = precision.make_optimizer(cfg.policy, cfg.learning_rate, cfg.loss_scale)
    optimizer.build(model.trainable_variables)  # Its slots must exist to be restored.
  speed = precision.check_speed(cfg.policy, precision.layer_classes(model), ready.cost)
  memory.reset_peak()  # This run's peak, not an earlier one's in the same process.
  # The dtype report: the memory estimate's layer sizes, and dtypes.json.
  with dist.strategy.scope():
    inspected = dtypes_lib.inspect_model(model, seed=cfg.seed)
  mem = preflight.for_run(
      cfg, inspected, sum(int(np.prod(v.shape)) for v in model.trainable_variables),
      dist.replicas, dist.workers, gpu=bool(tf.config.list_logical_devices("GPU")),
      remove=run_dir if not cfg.resume and dist.is_chief else None)
  ckpt = checkpoint.Checkpointer(run_dir, model, optimizer, cfg.keep_checkpoints,
                                 write_dir=out_dir)
  start_step, prior = 0, {}
  if cfg.resume:
    start_step, _, prior = ckpt.restore()
    if dist.is_chief:
      checkpoint.prune_events(run_dir, start_step)
    print(f"mpt: resuming {run_dir} at step {start_step}", flush=True)
  prior_wall = prior.get("wall_s", 0.0)

  report = inspected if cfg.instrument else None
  if report:
    rundir.write_json(out_dir / "dtypes.json", report)
    if dist.is_chief:
      print(dtypes_lib.one_line(report), flush=True)
  sampler = sampler_lib.Sampler(cfg.sample_every, state=prior.get("sampler")) \
      if cfg.instrument and dist.is_chief else None
  cbs = callbacks_lib.make(
      cfg, out_dir=str(out_dir), profile_dir=str(run_dir), start_step=start_step,
      prior=prior, window=window, fault_window=fault_window, ckpt=ckpt,
      steps_per_epoch=data.steps_per_epoch, sampler=sampler,
      flops_per_step=dtypes_lib.train_step_flops(report, cfg.batch_size)
      if report else None,
      loss_scale=lambda: precision.loss_scale(optimizer),
      skipped_steps=lambda steps: precision.skipped_steps(optimizer, steps),
      texts={"run/flags": "```\n" + config.to_flagfile(cfg) + "```",
             "precision/policy": precision.describe(policy),
             "run/strategy": dist.describe(),
             **({"precision/policy_choice": autopolicy.format_table(choice, True)}
                if choice else {}),
             **({"inspect/dtypes": dtypes_lib.format_table(report, markdown=True)}
                if report else {})},
      hparams=_hparams(cfg) if cfg.instrument and not cfg.resume else None,
      state=lambda timer, metrics: {
          "timer": timer.state(), "metrics": metrics.state(),
          "sampler": sampler.state() if sampler else None,
          "wall_s": prior_wall + time.perf_counter() - start})
  run = summary_lib.RunState(cfg, str(run_dir), policy, data, optimizer, cbs.timer,
                             ckpt, dist, speed, report, sampler,
                             choice, mem, ready.cost, ready.onednn)

  status, message = "failed", None  # Until the loop returns or is stopped.
  try:
    cbs.stop.install()
    injection.inject_run_fault(cfg.batch_size, cfg.policy)
    if sampler:
      sampler.start()
    with dist.strategy.scope():
      loops.LOOPS[cfg.loop](model, optimizer, data, cfg, cbs.ordered,
                            fetch=cbs.timer.fetch if cfg.instrument else None,
                            loss=steps_lib.make_loss(cbs.loss_factor),
                            start_step=start_step)
    cbs.checkpoints.save()
    status = "completed"
  except (KeyboardInterrupt, guards.Interrupted):
    status = "interrupted"
    saved = cbs.checkpoints.save() or ckpt.latest
    message = (f"mpt: interrupted at step {cbs.counter.done}; checkpoint {saved}"
               if cfg.checkpoint else f"mpt: interrupted at step {cbs.counter.done}; "
               "no checkpoint (--checkpoint=false): this run cannot be resumed")
  except guards.Diverged as e:
    status = "diverged"
    message = (f"mpt: {e}; last good checkpoint: {ckpt.latest or 'none'} "
               f"(resume with --resume={run_dir})")
  except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError) as e:
    if dist.workers < 2:
      message = f"{type(e).__name__}: {e}".strip()[:2000]
      raise
    # A worker died (TF's heartbeats noticed) or stopped answering for
    # --collective_timeout: collectives are aborted here, so nothing more is saved.
    status = "interrupted"
    lines = [l.strip() for l in str(e).splitlines() if l.strip()] or [""]
    why = next((l for l in lines if "aborted by" in l or "timed out" in l), lines[0])
    if isinstance(e, tf.errors.DeadlineExceededError):
      why = f"no answer within --collective_timeout={cfg.collective_timeout:g} s: {why}"
    folder = run_dir if dist.is_chief or cfg.resume else "<the chief's run folder>"
    message = (f"mpt: interrupted at step {cbs.counter.done}: another worker of the "
               f"cluster stopped answering ({why[:300]}); restart every "
               f"worker with --resume={folder} (from the chief's last checkpoint"
               f"{': ' + str(ckpt.latest) if dist.is_chief else ''})")
  except tf.errors.ResourceExhaustedError as e:  # An allocation TF could not make.
    status = "oom"
    first = (str(e).strip().splitlines() or [""])[0][:300]
    message = (f"mpt: out of memory at step {cbs.counter.done + 1}: {first}; the "
               f"estimate was {memory.human(mem['estimate']['total_mb'])} with "
               f"{memory.human(mem['available_mb'])} available (a smaller "
               "--batch_size or a 16-bit --policy needs less)")
  except BaseException as e:  # Failed: summary.json keeps why; the traceback follows.
    message = f"{type(e).__name__}: {e}".strip().rstrip(":")[:2000]
    raise
  finally:
    cbs.stop.uninstall()
    if cbs.window:
      cbs.window.close()
    if sampler:
      sampler.stop()
    summary = summary_lib.build(run, status,
                                prior_wall + time.perf_counter() - start, message)
    cbs.writer.write_final(summary.to_dict())
    summary.write(out_dir / "summary.json")
    if dist.is_chief:  # Its line in <logdir>/runs.csv, whatever the status.
      runs_lib.record(summary)
    if message and status != "failed":
      print(message, file=sys.stderr if status == "oom" else sys.stdout, flush=True)
    if after_run and dist.is_chief and status != "failed":  # A traceback says enough.
      text = after_run(run_dir)
      if text:
        cbs.writer.text("diagnosis/report", text)
    cbs.writer.close()
    if not dist.is_chief:
      shutil.rmtree(out_dir, ignore_errors=True)
      summary.run_dir = None

  where = run_dir if dist.is_chief else f"{dist.task} (the chief wrote the outputs)"
  parts = [f"mpt: {status}: {where}", f"{summary.steps} steps"]
  if summary.ms_per_step:
    parts.append(f"{summary.ms_per_step:.1f} ms/step")
  if summary.val_accuracy is not None:
    parts.append(f"val_accuracy {summary.val_accuracy:.3f}")
  parts.append(f"wall {summary.wall_s:.0f} s")
  print(", ".join(parts), flush=True)
  if dist.is_chief:
    print(f"mpt: look: tensorboard --logdir {cfg.logdir}", flush=True)
  return summary.to_dict()


def _hparams(cfg: config.Config) -> dict[str, Any]:
  return {k: getattr(cfg, k) for k in ("policy", "loop", "model", "batch_size",
                                       "image_size", "jit_compile", "dataset", "strategy",
                                       "model_opts", "batchnorm")}
