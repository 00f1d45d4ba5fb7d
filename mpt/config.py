"""One training run's configuration: its fields, defaults and checks, and its flagfile.

`Config` holds what one training run needs, grouped in the order a run uses it; its
field names are the command-line flag names. The other modes' flags are their own
dataclasses (mpt/sweep/options.py, mpt/microbench/options.py,
mpt/diagnose/options.py, mpt/compare/options.py), built with the same `flag()` and
checked by the same `validate()`; mpt/main.py defines one absl flag per field of all
of them. Tests build a `Config(...)` directly, and a run writes its Config back out as
a replayable flagfile (flags.txt). Defaults are sized for a laptop CPU: `python -m
mpt.main` trains the seed convnet on the generated synthetic data in about a minute on
2 cores.

Also here, because every part reads it: the one table of precision policies and their
compute dtypes (`POLICY_DTYPE`); the values of list flags are read by
mpt/flagvalues.py.
"""

import dataclasses
from typing import Any

from mpt import modelnames
from mpt.errors import UserError
from mpt.flagvalues import parse_patterns

# Each precision policy and the dtype its layers compute in.
POLICY_DTYPE = {"float32": "float32", "mixed_bfloat16": "bfloat16",
                "mixed_float16": "float16"}
# The 16-bit policies and their dtype, float16's first: the order --help, error
# messages and the diagnosis have always listed them in.
SIXTEEN = {p: d for p, d in reversed(POLICY_DTYPE.items()) if d != "float32"}
POLICIES = ("float32", *SIXTEEN, "auto")  # --policy's choices.
LOOPS = ("fit", "custom")
STRATEGIES = ("default", "mirrored", "multi_worker", "tpu")
# Flags added after runs were recorded, and the value a run without them had (a
# flags.txt without --batchnorm ran Keras' layer, whatever the default is now; one
# without --onednn ran TF's default, which `auto` keeps wherever it measures nothing;
# --numerics only measures, so a replay may sample them as runs do now).
FLAGS_ADDED_LATER = {"batchnorm": "keras", "checkpoint": True, "force": False,
                     "collective_timeout": 300.0, "onednn": "auto",
                     "layer_policy": "", "numerics": "auto"}
# Flags of the other modes (and --mode itself). A run's flags.txt written before the
# modes had their own options lists them all; reading one ignores them. A test checks
# this against the options classes.
OTHER_MODES_FLAGS = frozenset({
    "mode", "run", "batch_sizes", "policies", "loops", "image_sizes", "models",
    "jit_compiles", "seeds", "cell_timeout", "launcher", "ray_address", "machines",
    "cell_cpus",
    "cell_gpus", "shared_logdir",
    "microbench_sizes", "microbench_dtypes",
    "quick", "compare_python", "runs", "out"})


def flag(default: Any, help: str, choices: tuple[str, ...] | None = None,
         lower_bound: float | None = None) -> Any:
  """A dataclass field that is also a command-line flag (see mpt/main.py)."""
  return dataclasses.field(default=default, metadata=dict(
      help=help, choices=choices, lower_bound=lower_bound))


@dataclasses.dataclass
class Config:
  """One training run. Field names are the command-line flag names."""
  # What runs.
  policy: str = flag("float32", "Keras dtype policy, set globally before the model "
                       "is built; `auto` trains a few steps under each and then trains "
                       "with the one measured fastest here (single runs only).",
                       choices=POLICIES)
  layer_policy: str = flag(
      "", "Per-layer policies over --policy, `PATTERN=POLICY,...`: PATTERN is a layer "
      "class or a regular expression of whole layer names; the first pattern matching "
      "a layer decides. Loss scaling whenever a layer computes in float16.")
  loop: str = flag("fit", "Who drives the train step: Keras `fit`, or mpt's own "
                     "tf.function loop (`custom`).", choices=LOOPS)
  model: str = flag("seed_convnet", "Model: a variant from the registry in "
                      "mpt/models/, keras:NAME (keras.applications) or "
                      "package.module:function (your builder).")
  # Fused by default: experiments/bench_peer.py measured it faster than Keras' layer
  # (experiments/README.md) and tests/models/test_fused_bn.py holds it equivalent.
  batchnorm: str = flag(
      "fused", "BatchNormalization layers: `fused` (TF's fused kernel, oneDNN on CPU; "
      "Keras' variables and math, mpt/models/fused_bn.py) or `keras` (Keras' own layer, "
      "separate float32 ops). With synchronized BatchNorm across replicas Keras' "
      "layer is kept.", choices=("keras", "fused"))
  model_opts: str = flag("", "Options of the --model builder, "
                           "`key=value,key=value` (e.g. resnet: depth=10,width=32).")

  # Data.
  dataset: str = flag(
      "synthetic", "`synthetic` (generated offline), `folder:PATH` (imagenette2-320 "
      "layout: PATH/train/<class>/*.JPEG, PATH/val/<class>/*.JPEG) or a TFDS name "
      "such as `imagenette/320px`.")
  data_dir: str = flag("", "TFDS data_dir; for `synthetic`, where the generated "
                         "JPEGs are cached (default ~/.cache/mpt).")
  download: bool = flag(False, "Let TFDS download and prepare the dataset.")
  image_size: int = flag(64, "Images are resized to image_size x image_size "
                           "(the reference run used 256).", lower_bound=1)
  batch_size: int = flag(32, "Global batch size: each step's batch, split evenly "
                           "across the replicas of --strategy.", lower_bound=1)
  synthetic_train: int = flag(1300, "Synthetic training images (all classes).",
                                lower_bound=10)
  synthetic_val: int = flag(500, "Synthetic validation images.", lower_bound=10)
  synthetic_px: int = flag(160, "Longest side of the generated JPEGs (Imagenette's "
                             "320px version has 320).", lower_bound=16)
  shuffle_buffer: int = flag(0, "Shuffle buffer; 0 = the whole training set (the "
                               "reference run used 12895/batch_size).", lower_bound=0)
  input_work: int = flag(0, "Extra per-example work in the training input "
                           "pipeline: N passes of a 3x3 blur over each image, computed "
                           "and then discarded, to make a run input bound on purpose.",
                           lower_bound=0)
  cache: str = flag("memory", "Where the resized float32 images are cached: "
                      "`memory`, `none`, or a file path prefix.")

  # Training.
  epochs: int = flag(4, "Training epochs.", lower_bound=1)
  steps_per_epoch: int = flag(0, "Cap on train steps per epoch; 0 = one pass over "
                                "the training set.", lower_bound=0)
  learning_rate: float = flag(1e-3, "Adam learning rate.")
  bn_momentum: float = flag(
      0.9, "BatchNorm moving-average momentum. Keras' default 0.99 (the reference "
      "run's) leaves the moving statistics unsettled in short runs.")
  seed: int = flag(0, "Seeds weights, shuffling and synthetic data generation.")
  deterministic: bool = flag(False, "TensorFlow op determinism: repeated runs give "
                               "bitwise-identical results (slower on GPUs).")
  loss_scale: str = flag("dynamic", "mixed_float16 loss scaling: `dynamic`, or a "
                           "fixed number.")
  min_loss_scale: float = flag(1.0, "A dynamic loss scale that falls below this "
                                 "means gradients stay non-finite: the run stops as "
                                 "diverged.")

  # Devices.
  strategy: str = flag(
      "default", "tf.distribute strategy: `default` (one device), `mirrored` (this "
      "machine's GPUs, or --cpu_devices logical CPUs), `multi_worker` (the cluster in "
      "TF_CONFIG), `tpu` (untested).", choices=STRATEGIES)
  cpu_devices: int = flag(0, "Split the CPU into N logical devices, so that "
                            "--strategy=mirrored runs N replicas on a CPU-only "
                            "machine; 0 = leave the CPU as one device.", lower_bound=0)
  collective_timeout: float = flag(
      300.0, "multi_worker: seconds a worker waits at a collective (a step's "
      "all-reduce, a checkpoint) for the others before it stops the run as "
      "interrupted, saying which; a dead worker is noticed sooner, by TensorFlow's "
      "heartbeats. 0 = wait forever.", lower_bound=0)
  sync_batchnorm: bool = flag(
      True, "With more than one replica, BatchNorm statistics over the global batch "
      "(Keras synchronized=True), so results match one device; --nosync_batchnorm "
      "uses per-replica statistics (one all-reduce fewer per BatchNorm layer).")
  tf32: bool = flag(True, "On Ampere or newer GPUs, float32 matmuls and "
                      "convolutions run as TF32 on Tensor Cores (TensorFlow's "
                      "default); --notf32 measures a plain FP32 baseline. No effect "
                      "on CPUs.")
  onednn: str = flag(
      "auto", "TensorFlow's oneDNN graph rewrite on CPUs (TF_ENABLE_ONEDNN_OPTS, set for "
      "the training process before TensorFlow starts). `auto`: TF's default where it "
      "is on (CPUs with AVX512_VNNI, AVX512_BF16 or AMX); where TF leaves it off, this "
      "model's step is measured with and without it and the faster kept. `on`/`off` "
      "force it. flags.txt records the state the run trained with.",
      choices=("auto", "on", "off"))
  jit_compile: bool = flag(False, "Compile the train/eval step with XLA in both "
                             "loops.")

  # Measurement.
  warmup_steps: int = flag(5, "Steps at the start of the run left out of "
                             "ms_per_step (tracing, allocator and cache warm-up).",
                             lower_bound=0)
  numerics: str = flag(
      "auto", "Per-layer numerics on real batches (numerics.json): each layer's "
      "largest output and gradient against float16's range (above 65504, below "
      "2^-24 at loss scale 1 and at the run's), and its output's bfloat16 error. "
      "`auto`: in runs computing in a 16-bit dtype and in --mode=inspect; `on`: every "
      "run (a float32 run learns what float16 would do); `off`.",
      choices=("auto", "on", "off"))
  instrument: bool = flag(True, "Data-wait timing, utilisation sampling, per-step "
                            "perf/precision/util scalars, dtype inspection, HParams. "
                            "--noinstrument measures their cost; ms_per_step stays.")
  log_every: int = flag(10, "Steps between perf/, precision/ and util/ scalars.",
                          lower_bound=1)
  sample_every: float = flag(1.0, "Seconds between utilisation samples.")
  profile_steps: str = flag("", "A,B: profile global train steps A..B (1-based, "
                              "after warm-up) into the run folder; default: on a "
                              "GPU the 2 steps after warm-up, else none; off: none.")

  # Output, checkpoints and resume.
  logdir: str = flag("logs", "Root folder of run folders (TensorBoard --logdir).")
  run_name: str = flag("", "Run folder name under logdir; default "
                         "<time>_<model>_<policy>_<loop>. Never overwritten: a "
                         "suffix is added if it exists.")
  verbose: int = flag(1, "Keras progress bar: 0 silent, 1 bar, 2 one line per "
                        "epoch.", lower_bound=0)

  force: bool = flag(False, "Do it anyway: train when the memory estimate says the "
                       "step will not fit; in a sweep, also rerun the cells it already "
                       "holds and start those predicted not to fit.")
  checkpoint: bool = flag(True, "Save checkpoints (every --checkpoint_every steps, at "
                           "epoch ends, on interruption). --checkpoint=false writes "
                           "none: the run cannot be resumed, as summary.json says.")
  checkpoint_every: int = flag(100, "Steps between checkpoints (also saved at each "
                                 "epoch end and on interruption); 0 = epoch ends only.",
                                 lower_bound=0)
  keep_checkpoints: int = flag(3, "Checkpoints kept in <run>/checkpoints.",
                                 lower_bound=1)
  resume: str = flag("", "Run folder (logs/<run>) to continue from its latest "
                       "checkpoint, with the flags it was started with.")

  # Fault injection, for testing.
  fault_factor: float = flag(1.0, "Fault injection for testing: multiply the loss "
                               "by this (1e30 overflows float16, nan diverges) during "
                               "--fault_steps.")
  fault_steps: str = flag("", "A,B: global steps the --fault_factor applies to.")


def fields(options: Any = None) -> tuple[dataclasses.Field, ...]:
  """The fields (flags) of Config, or of another options dataclass or instance."""
  return dataclasses.fields(options or Config)


def validate(cfg: Any) -> Any:
  """Checks what a flag parser cannot; raises UserError with a one-line reason.

  Any options dataclass built with `flag()` gets the choices and bounds checks; a
  Config also the checks of one run.
  """
  for f in fields(Config if isinstance(cfg, Config) else cfg):  # A Plan: its flags.
    value = getattr(cfg, f.name)
    choices, bound = f.metadata["choices"], f.metadata["lower_bound"]
    if choices and value not in choices:
      raise UserError(f"unknown --{f.name}={value!r}; valid: {', '.join(choices)}")
    if bound is not None and value < bound:
      raise UserError(f"--{f.name} must be >= {bound:g}, got {value}")
  if not isinstance(cfg, Config):
    return cfg
  if not cfg.learning_rate > 0:
    raise UserError(f"--learning_rate must be > 0, got {cfg.learning_rate}")
  if not cfg.sample_every > 0:
    raise UserError(f"--sample_every must be > 0 seconds, got {cfg.sample_every}")
  if not 0.0 <= cfg.bn_momentum < 1.0:
    raise UserError(f"--bn_momentum must be in [0, 1), got {cfg.bn_momentum}")
  if cfg.loss_scale != "dynamic":
    try:
      if not float(cfg.loss_scale) > 0:
        raise ValueError
    except ValueError:
      raise UserError(f"--loss_scale must be `dynamic` or a number > 0, got "
                      f"{cfg.loss_scale!r}") from None
  if not cfg.dataset:
    raise UserError("--dataset is empty; use synthetic, folder:PATH or a TFDS name")
  modelnames.check(cfg.model)
  layer_policies(cfg.layer_policy)
  if cfg.layer_policy and cfg.policy == "auto":
    raise UserError("--layer_policy with --policy=auto: auto considers the per-layer "
                    "plan itself; give --policy")
  return cfg


def layer_policies(spec: str) -> list[tuple[str, str]]:
  """--layer_policy's `PATTERN=POLICY,...` -> [(pattern, policy)], in order."""
  return parse_patterns(spec, "layer_policy", tuple(POLICY_DTYPE))


def sixteen_bit(policy: str, layers: Any = ()) -> str | None:
  """The 16-bit policy a run computes in: its policy where that is 16-bit, else the
  first 16-bit policy its --layer_policy pairs (`layer_policies`) give layers (a
  float32 run that keeps its convolutions in float16 is a 16-bit run); None where
  every layer is float32. The one answer to "is this run 16-bit" (a run's Plan, the
  records; loss scaling asks the narrower `scales`)."""
  return next((p for p in (policy, *(p for _, p in layers)) if p in SIXTEEN), None)


def scales(*policies: str) -> bool:
  """Whether any of these policies computes in float16: the one rule of when a run
  scales its loss (float16's range needs it; bfloat16's does not)."""
  return any(POLICY_DTYPE.get(p) == "float16" for p in policies)


def scales_loss(run: Any) -> bool:
  """Whether any layer of a recorded run (its policy and --layer_policy strings)
  computes in float16 (loss scaling is then used)."""
  return scales(run.policy, *(p for _, p in layer_policies(run.layer_policy)))


def from_flagfile(text: str) -> Config:
  """Parses what `to_flagfile` wrote (a run's flags.txt) back into a Config."""
  values = {}
  types = {f.name: type(f.default) for f in fields()}
  for line in text.split("\n"):
    line = line.strip()
    if not line.startswith("--"):
      continue
    name, eq, value = line[2:].partition("=")
    if not eq:  # Boolean: --name or --noname.
      name, value = (name, True) if name in types else (name[2:], False)
    elif types.get(name) is int:
      value = int(value)
    elif types.get(name) is float:
      value = float(value)
    if name in OTHER_MODES_FLAGS and name not in types:
      continue
    if name not in types:
      raise UserError(f"unknown flag --{name} in flags file")
    values[name] = value
  # Written before these flags existed: the run had what they now call these values.
  for name, then in FLAGS_ADDED_LATER.items():
    values.setdefault(name, then)
  return Config(**values)


def to_flagfile(cfg: Config) -> str:
  """The config as an absl flagfile that replays this run."""
  lines = []
  for f in fields():
    value = getattr(cfg, f.name)
    if isinstance(value, bool):
      lines.append(f"--{f.name}" if value else f"--no{f.name}")
    else:
      lines.append(f"--{f.name}={value}")
  return "\n".join(lines) + "\n"
