"""Command line: flags -> options -> the mode table, the one place that knows every mode.

  python -m mpt.main                                   # default run, ~1 min on 2 cores
  python -m mpt.main --policy=mixed_float16 --loop=custom
  python -m mpt.main --flagfile=experiments/seed.flags

Every flag is a field of one options dataclass: `mpt.config.Config` (one training
run), `SweepOptions`, `MicrobenchOptions`, `DiagnoseOptions` or `CompareOptions` (the
wings' own), plus `--mode`. The wings are imported only when their mode runs, so
`--help` and flag errors answer without importing TensorFlow. After `train` and
`sweep`, the diagnosis runs on the folder they wrote. Bad input ends in one `mpt: error:
...` line and exit status 2; Ctrl-C in exit status 130 with the run's summary.json
written (status `interrupted`), a diverged run in exit status 3, a run out of memory in
exit status 4 (status `oom`; a death by signal is recorded by the watching parent,
mpt/supervisor.py).
"""

import sys

from absl import app
from absl import flags

from mpt import console

console.quiet_tensorflow()  # Before any wing imports TensorFlow.

from mpt import config  # noqa: E402
from mpt.compare.options import CompareOptions  # noqa: E402
from mpt.diagnose.options import DiagnoseOptions  # noqa: E402
from mpt.errors import UserError  # noqa: E402
from mpt.microbench.options import MicrobenchOptions  # noqa: E402
from mpt.sweep.options import SweepOptions  # noqa: E402
from mpt import supervisor  # noqa: E402

FLAGS = flags.FLAGS


def _train(cfg, opts):
  console.import_tensorflow()
  from mpt.diagnose import diagnosis
  from mpt.train import run
  return run.train_and_evaluate(cfg, after_run=diagnosis.after_run)


def _inspect(cfg, opts):
  console.import_tensorflow()
  from mpt.train import dryrun
  return dryrun.inspect_only(cfg)


def _microbench(cfg, opts):
  console.import_tensorflow()
  from mpt.microbench import run
  return run.run(cfg, opts[MicrobenchOptions])


def _sweep(cfg, opts):
  from mpt.diagnose import diagnosis
  from mpt.sweep import run
  return run.run(cfg, opts[SweepOptions], after_run=diagnosis.after_run)


def _diagnose(cfg, opts):
  from mpt.diagnose import diagnosis
  return diagnosis.run(opts[DiagnoseOptions])


def _compare(cfg, opts):
  from mpt.compare import run
  return run.run(opts[CompareOptions])


# THE mode table. Each entry imports its wing when it runs. `train` and `sweep` get
# the diagnosis as their after-run step (a wing never imports another wing).
MODES = {"train": _train, "inspect": _inspect, "microbench": _microbench,
         "sweep": _sweep, "diagnose": _diagnose, "compare": _compare}
OPTIONS = (config.Config, SweepOptions, MicrobenchOptions, DiagnoseOptions,
           CompareOptions)
EXIT_CODES = {"completed": 0, "interrupted": 130, "diverged": 3,
              "oom": supervisor.OOM_EXIT}
# With --resume a run continues with the flags it was started with; only these may be
# given along with it.
RESUME_FLAGS = {"resume", "verbose", "flagfile"}


def all_fields():
  """Every flag but --mode: the fields of Config and of each mode's options."""
  return [f for options in OPTIONS for f in config.fields(options)]


def _define_flags() -> None:
  """--mode, and one absl flag per options field, with its default, help and bounds."""
  flags.DEFINE_enum(
      "mode", "train", list(MODES), "`train` a model, `inspect` its per-layer dtypes "
      "and FLOPs without training, `microbench` the CPU and TensorFlow, `sweep` batch "
      "sizes x policies x loops, `diagnose` an existing run or sweep folder (--run), or "
      "`compare` finished runs in one table (--runs).")
  for f in all_fields():
    meta, default = f.metadata, f.default
    if meta["choices"]:
      flags.DEFINE_enum(f.name, default, list(meta["choices"]), meta["help"])
    elif f.type is bool or isinstance(default, bool):
      flags.DEFINE_bool(f.name, default, meta["help"])
    elif isinstance(default, int):
      flags.DEFINE_integer(f.name, default, meta["help"],
                           lower_bound=meta["lower_bound"])
    elif isinstance(default, float):
      flags.DEFINE_float(f.name, default, meta["help"])
    else:
      flags.DEFINE_string(f.name, default, meta["help"])


_define_flags()


def main(argv: list[str], supervise: bool = False) -> int:
  """The mode's exit status. `supervise` (the command line): train in a watched child
  process (mpt/supervisor.py), so that a death by signal still ends in summary.json."""
  # absl at WARNING (TF logs each checkpoint's sharding and each traced all-reduce
  # through it) unless -v/--verbosity asks for more.
  console.quiet_absl(FLAGS["verbosity"].present)
  if len(argv) > 1:
    print(f"mpt: error: unexpected arguments {argv[1:]}; flags look like "
          "--name=value", file=sys.stderr)
    return 2
  opts = {cls: cls(**{f.name: getattr(FLAGS, f.name) for f in config.fields(cls)})
          for cls in OPTIONS}
  cfg = opts[config.Config]
  if cfg.resume:
    extra = sorted(name for name in ["mode"] + [f.name for f in all_fields()]
                   if FLAGS[name].present and name not in RESUME_FLAGS)
    if extra:
      print(f"mpt: error: --resume continues a run with the flags it was started with;"
            f" drop --{', --'.join(extra)}", file=sys.stderr)
      return 2
  if supervise and FLAGS.mode == "train" and not supervisor.supervised():
    from mpt.train import onednn_choice  # Imports no TensorFlow: the child will.
    try:
      child_env = onednn_choice.for_child(cfg)
    except UserError as e:
      print(f"mpt: error: {e}", file=sys.stderr)
      return 2
    try:
      return supervisor.run(sys.argv, child_env)
    finally:
      onednn_choice.forget(child_env)
  try:
    summary = MODES[FLAGS.mode](cfg, opts)
  except UserError as e:
    print(f"mpt: error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:  # Before the run folder existed: nothing to save.
    print("mpt: interrupted", file=sys.stderr)
    return 130
  return EXIT_CODES[summary["status"]]


def run() -> None:
  """Console-script entry point (`mpt ...`)."""
  # absl's --help lists the main script's key flags; for the `mpt` wrapper script that
  # is not this module, so name ours as its key flags.
  for name in ["mode"] + [f.name for f in all_fields()]:
    FLAGS.register_key_flag_for_module(sys.argv[0], FLAGS[name])
  app.run(lambda argv: main(argv, supervise=True))


if __name__ == "__main__":
  run()
