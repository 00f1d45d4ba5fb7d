"""Command line: parses flags and hands a `Config` to the mode that runs it.

  python -m mpt.main                                   # default run, ~1 min on 2 cores
  python -m mpt.main --policy=mixed_float16 --loop=custom
  python -m mpt.main --flagfile=experiments/seed.flags

Every flag is a field of `mpt.config.Config` (see there, or `--helpfull`). Bad input
ends in one `mpt: error: ...` line and exit status 2; Ctrl-C in exit status 130 with the
run's summary.json written (status `interrupted`), a diverged run in exit status 3.
"""

import logging as std_logging
import sys

from absl import app
from absl import flags

from mpt import config
from mpt.errors import UserError

FLAGS = flags.FLAGS
EXIT_CODES = {"completed": 0, "interrupted": 130, "diverged": 3}
# With --resume a run continues with the flags it was started with; only these may be
# given along with it.
RESUME_FLAGS = {"resume", "verbose", "flagfile"}


def _define_flags() -> None:
  """One absl flag per Config field, with the field's default, help and bounds."""
  for f in config.fields():
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


def main(argv: list[str]) -> int:
  # TensorFlow's own INFO lines (each all-reduce traced, each checkpoint's sharding
  # callback) drown mpt's; its warnings and errors still show.
  std_logging.getLogger("tensorflow").setLevel(std_logging.WARNING)
  if len(argv) > 1:
    print(f"mpt: error: unexpected arguments {argv[1:]}; flags look like "
          "--name=value", file=sys.stderr)
    return 2
  cfg = config.Config(**{f.name: getattr(FLAGS, f.name) for f in config.fields()})
  if cfg.resume:
    extra = sorted(f.name for f in config.fields()
                   if FLAGS[f.name].present and f.name not in RESUME_FLAGS)
    if extra:
      print(f"mpt: error: --resume continues a run with the flags it was started with;"
            f" drop --{', --'.join(extra)}", file=sys.stderr)
      return 2
  try:
    # Imported here so that flag errors and --help answer without importing TF.
    from mpt import train
    summary = train.MODES[cfg.mode](cfg)
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
  for f in config.fields():
    FLAGS.register_key_flag_for_module(sys.argv[0], FLAGS[f.name])
  app.run(main)


if __name__ == "__main__":
  run()
