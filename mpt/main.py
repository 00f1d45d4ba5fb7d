"""Command line: flags -> options -> the mode table, the one place that knows every mode.

  python -m mpt.main                                   # default run, ~1 min on 2 cores
  python -m mpt.main --policy=mixed_float16 --loop=custom
  python -m mpt.main --flagfile=experiments/seed.flags

Every flag is a field of one options dataclass: `mpt.config.Config` (one training
run), `SweepOptions`, `MicrobenchOptions`, `DiagnoseOptions` or `CompareOptions` (the
wings' own), plus `--mode`. The wings are imported only when their mode runs, so
`--help` and flag errors answer without importing TensorFlow. After `train` and
`sweep`, the diagnosis runs on the folder they wrote. Bad input (absl's flag errors
too) ends in one `mpt: error: ...` line and exit status 2; every other ending has its
status in mpt/errors.py's one table (`EXIT`, `exit_status`; a death by signal is named
by the watching parent, mpt/supervisor.py).
"""

import gc
import sys

from absl import app
from absl import flags

from mpt import console

console.quiet_tensorflow()  # Before any wing imports TensorFlow.
_BACKEND_NOTE = console.keras_on_tensorflow()  # Before any wing imports Keras.

from mpt import config  # noqa: E402
from mpt.compare.options import CompareOptions  # noqa: E402
from mpt.diagnose.options import DiagnoseOptions  # noqa: E402
from mpt import errors  # noqa: E402
from mpt.errors import UserError  # noqa: E402
from mpt.microbench.options import MicrobenchOptions  # noqa: E402
from mpt.sweep.options import SweepOptions  # noqa: E402
from mpt import supervisor  # noqa: E402

FLAGS = flags.FLAGS


def _train(cfg, opts):
  # Under the supervisor its reader filters this process's stderr: no second filter.
  console.import_tensorflow(parent_filters=supervisor.supervised())
  from mpt.diagnose import diagnosis
  from mpt.train.cli import run
  # What the imports made lives as long as the process: out of Python's collections,
  # each of which (Keras' clear_session forces some) then walks only what the run
  # made (0.2 s less each, on a Zen 4).
  gc.freeze()
  return run.train_and_evaluate(cfg, after_run=diagnosis.after_run)


def _inspect(cfg, opts):
  console.import_tensorflow()
  from mpt.train.cli import dryrun
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
  # Its start-up lines filtered, as in every mode using it; no GPU line: it reads files.
  console.import_tensorflow(say_no_gpu=False)
  from mpt.diagnose import diagnosis
  return diagnosis.run(opts[DiagnoseOptions])


def _compare(cfg, opts):
  from mpt.compare import run
  return run.run(opts[CompareOptions])


# THE mode table. Each entry imports its wing when it runs. `train` and `sweep` get
# the diagnosis as their after-run step (a wing never imports another wing).
MODES = {"train": _train, "inspect": _inspect, "microbench": _microbench,
         "sweep": _sweep, "diagnose": _diagnose, "compare": _compare}
# With --resume a run continues with the flags it was started with; only these may be
# given along with it.
RESUME_FLAGS = {"resume", "verbose", "flagfile"}


# --help's groups, one per mode (absl groups flags by the module name they were
# defined under; all are defined here, so each options class gets its mode's name).
GROUPS = {config.Config: "a training run (--mode=train, --mode=inspect, each sweep cell)",
          SweepOptions: "--mode=sweep", MicrobenchOptions: "--mode=microbench",
          DiagnoseOptions: "--mode=diagnose", CompareOptions: "--mode=compare"}
OPTIONS = tuple(GROUPS)  # Every options class, Config first.
MODE_GROUP = "mpt (python -m mpt --mode=MODE --flag=value ...)"
USAGE = """mpt: does mixed precision make my model train faster here, and if not, why not?

  python -m mpt                                   # train the seed convnet, ~1 min on a CPU
  python -m mpt --policy=mixed_float16 --loop=custom
  python -m mpt --mode=inspect --model=mynets:build_net
  python -m mpt --mode=diagnose --run=logs/<run>

The flags, by mode (docs/usage.md describes each):"""
HELP_FLAGS = ("--help", "-help", "-h", "-?", "--helpshort", "-helpshort")


def all_fields():
  """Every flag but --mode: the fields of Config and of each mode's options."""
  return [f for options in OPTIONS for f in config.fields(options)]


def _define_flags() -> None:
  """--mode, and one absl flag per options field, with its default, help and bounds."""
  flags.DEFINE_enum(
      "mode", "train", list(MODES), module_name=MODE_GROUP, help="`train` a model, `inspect` its per-layer dtypes "
      "and FLOPs without training, `microbench` the CPU and TensorFlow, `sweep` batch "
      "sizes x policies x loops, `diagnose` an existing run or sweep folder (--run), or "
      "`compare` finished runs in one table (--runs).")
  for options, group in GROUPS.items():
    for f in config.fields(options):
      meta, default = f.metadata, f.default
      if meta["choices"]:
        flags.DEFINE_enum(f.name, default, list(meta["choices"]), meta["help"],
                          module_name=group)
      elif f.type is bool or isinstance(default, bool):
        flags.DEFINE_bool(f.name, default, meta["help"], module_name=group)
      elif isinstance(default, int):
        flags.DEFINE_integer(f.name, default, meta["help"],
                             lower_bound=meta["lower_bound"], module_name=group)
      elif isinstance(default, float):
        flags.DEFINE_float(f.name, default, meta["help"], module_name=group)
      else:
        flags.DEFINE_string(f.name, default, meta["help"], module_name=group)


_define_flags()


def main(argv: list[str], supervise: bool = False) -> int:
  """The mode's exit status. `supervise` (the command line): train in a watched child
  process (mpt/supervisor.py), so that a death by signal still ends in summary.json."""
  # absl at WARNING (TF logs each checkpoint's sharding and each traced all-reduce
  # through it) unless -v/--verbosity asks for more.
  console.quiet_absl(FLAGS["verbosity"].present)
  if _BACKEND_NOTE:
    print(_BACKEND_NOTE, flush=True)
  if len(argv) > 1:
    print(f"mpt: error: unexpected arguments {argv[1:]}; flags look like "
          "--name=value", file=sys.stderr)
    return 2
  opts = options()
  cfg = opts[config.Config]
  if cfg.resume:
    extra = sorted(name for name in ["mode"] + [f.name for f in all_fields()]
                   if FLAGS[name].present and name not in RESUME_FLAGS)
    if extra:
      print(f"mpt: error: --resume continues a run with the flags it was started with;"
            f" drop --{', --'.join(extra)}", file=sys.stderr)
      return 2
  if supervise and FLAGS.mode == "train" and not supervisor.supervised():
    from mpt.train.before_step1 import onednn_choice  # Imports no TensorFlow: the child will.
    try:
      config.validate(cfg)  # Before any child (the oneDNN choice's, the run's) starts.
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
    return errors.stopped_by("SIGINT")
  return exit_status(summary)


def options() -> dict:
  """The parsed flags as each mode's options dataclass, keyed by its class."""
  return {cls: cls(**{f.name: getattr(FLAGS, f.name) for f in config.fields(cls)})
          for cls in OPTIONS}


def exit_status(result: dict) -> int:
  """The exit status of a mode's result (errors.EXIT, one table for every mode)."""
  if result["status"] == "completed" and result.get("cells_not_completed"):
    return errors.EXIT["cells_failed"]
  return errors.exit_status(result["status"], result.get("stop_signal"))


def run() -> None:
  """Console-script and `python -m mpt` entry point. --help: the usage lines, then the
  flags grouped by mode (absl's own --helpshort lists a main module's flags in one
  block)."""
  if any(a in HELP_FLAGS for a in sys.argv[1:]):
    groups = [FLAGS.module_help(g).strip("\n") for g in [MODE_GROUP, *GROUPS.values()]]
    print(f"{USAGE}\n\n" + "\n\n".join(groups) +
          "\n\nabsl's own flags (--flagfile, -v, ...): --helpfull")
    sys.exit(0)
  app.run(lambda argv: main(argv, supervise=True), flags_parser=_parse_flags)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parsing, with a bad flag ending as any bad input does: one `mpt: error:`
  line and exit status 2 (absl's own exits 1, which a script reads as a bug)."""
  try:
    return FLAGS(argv)
  except flags.Error as e:
    print(f"mpt: error: {e} (python -m mpt --help lists the flags)", file=sys.stderr)
    sys.exit(errors.EXIT["usage"])


if __name__ == "__main__":
  run()
