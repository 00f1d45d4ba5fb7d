"""`--mode=sweep`: the seed's table, from one command. Batch size x policy x loop (and
optionally image size, model, XLA, seeds), every cell its own training run in a child
process.

  python -m mpt.main --mode=sweep --batch_sizes=16,32,64 \\
      --policies=float32,mixed_bfloat16 --loops=fit,custom

A child per cell gives fresh TensorFlow state, and a crash or an out-of-memory in one
cell cannot poison the next. A cell ended as its run recorded itself in summary.json
(mpt/sweep/cell.py): `ok`, `OOM` (TF's allocator, or a SIGKILL while the kernel
counted an OOM kill: the child's supervisor records it), `failed`, `diverged` or
`interrupted`, with the record's message; a cell past `--cell_timeout` seconds is
killed and recorded as `timeout`. The sweep goes on either way.

Each cell's figure is its summary.json's `ms_per_step`: the median step time after
`--warmup_steps` (the seed took epoch 20 and skipped epoch 1; here the warm-up is
counted in steps). Cells are appended to `sweep.csv` as they finish, with the
environment (TF version, device, CPU ISA); the same command again resumes, skipping
cells that completed or ran out of memory (`--force` reruns them). The sweep folder is
`logdir/<run_name>`, by default named after a hash of the sweep's flags, which is how
the same command finds it again. At the end, and on Ctrl-C with what finished, the
table is printed and written as `sweep.md`; `sweep.png` plots ms/step and images/s
against batch size (matplotlib, optional); the cells' run folders under `cells/` are
TensorBoard HParams runs.
"""

import dataclasses
import hashlib
import itertools
import pathlib
import signal
import sys
import time
from typing import Any

from mpt import config
from mpt import console
from mpt import flagvalues
from mpt import injection
from mpt.errors import EXIT, STOP_SIGNALS, UserError
from mpt.machine import hardware
from mpt.records import cells as cells_lib
from mpt.records.cells import Cell
from mpt.records.memory import MemoryPlan
from mpt.records.rundir import AfterRun
from mpt.sweep import memoryplans
from mpt.sweep import requests
from mpt.sweep.cell import AXES, Stopped, run_cell, stop
from mpt.sweep import report as sweep_report
from mpt.sweep.options import SweepOptions

# Fields that say where and how the sweep runs, not what it measures: left out of the
# sweep folder's default name, so that the same sweep finds its folder again.
BOOKKEEPING = ("run_name", "verbose", "logdir", "force", "cell_timeout", "launcher",
               "ray_address", "machines", "cell_cpus", "cell_gpus", "shared_logdir")
# Hashed into the default name with the sweep's own flags: sweep folders already on
# disk were named from a flag set shared by all modes, these at their defaults, and
# the same command must keep finding its folder (a test pins two names).
OTHER_MODES_IN_NAME = {"run": "", "microbench_sizes": "256,512,1024,2048",
                       "microbench_dtypes": "float32,bfloat16,float16", "quick": False,
                       "compare_python": ""}
# Flags added after the naming scheme: at the value sweeps had before they existed
# (config.FLAGS_ADDED_LATER) they leave the name as it was.
NEWER_FLAGS = {**config.FLAGS_ADDED_LATER, "seeds": 1}
FINISHED = ("ok", "OOM", "OOM (predicted)")


def _parse_axis(cfg: config.Config, opts: SweepOptions, name: str) -> list:
  field, kind = AXES[name]
  spec = getattr(opts, name)
  if name == "seeds":
    return [cfg.seed + i for i in range(spec)]
  if not spec:
    return [getattr(cfg, field)]
  values = flagvalues.parse_list(
      spec, name, flagvalues.parse_bool if kind is bool else kind,
      what={int: "whole numbers", bool: "true/false"}.get(kind, "values"),
      empty="has an empty item; use a comma-separated list")
  for value in values:  # Each value goes through the single-run checks.
    try:
      config.validate(dataclasses.replace(cfg, **{field: value}))
    except UserError as e:
      raise UserError(f"--{name}: {e}") from None
  return values


def cells(cfg: config.Config, opts: SweepOptions) -> list[Cell]:
  """Every cell of the sweep, in table order; UserError before any cell runs."""
  axes = {AXES[name][0]: _parse_axis(cfg, opts, name) for name in AXES}
  n_train = _dataset_size(cfg)
  too_big = [b for b in axes["batch_size"] if n_train is not None and b > n_train]
  if too_big:
    raise UserError(f"--batch_sizes: {too_big[0]} is larger than the training set "
                    f"({n_train} images)")
  return [Cell(**dict(zip(axes, values))) for values in itertools.product(*axes.values())]


def _dataset_size(cfg: config.Config) -> int | None:
  """Training images, where known without loading the data (TFDS: not checked)."""
  if cfg.dataset == "synthetic":
    return cfg.synthetic_train
  if cfg.dataset.startswith("folder:"):
    train = pathlib.Path(cfg.dataset[len("folder:"):]).expanduser() / "train"
    return sum(1 for p in train.rglob("*") if p.is_file()) if train.is_dir() else None
  return None


def sweep_dir(cfg: config.Config, opts: SweepOptions) -> pathlib.Path:
  """logdir/<run_name>, or a name hashed from the flags that define the sweep."""
  if cfg.run_name:
    return pathlib.Path(cfg.logdir).expanduser() / cfg.run_name
  defining = dict(OTHER_MODES_IN_NAME)
  for options in (cfg, opts):
    defining.update({f.name: getattr(options, f.name) for f in config.fields(options)
                     if f.name not in BOOKKEEPING and not
                     (f.name in NEWER_FLAGS and
                      getattr(options, f.name) == NEWER_FLAGS[f.name])})
  digest = hashlib.sha1(repr(sorted(defining.items())).encode()).hexdigest()[:8]
  return pathlib.Path(cfg.logdir).expanduser() / f"sweep-{digest}"


def _check(cfg: config.Config, opts: SweepOptions) -> None:
  """What fails the whole sweep before any cell runs (UserError)."""
  config.validate(cfg)
  config.validate(opts)
  if opts.launcher == "local" and (opts.machines != "one" or opts.ray_address or
                                   opts.shared_logdir):
    raise UserError("--machines=all, --ray_address and --shared_logdir need "
                    "--launcher=ray")
  requests.parse_gpus(opts.cell_gpus)
  if cfg.policy == "auto" or "auto" in [p.strip() for p in opts.policies.split(",")]:
    raise UserError("--policy=auto is for single runs; a sweep measures every policy "
                    f"anyway: --policies={','.join(config.POLICY_DTYPE)}")
  injection.injected_faults()  # A malformed MPT_INJECT_FAULT would fail every cell.


def _run_cells(cfg: config.Config, opts: SweepOptions, todo: list[Cell],
               done: dict[str, Cell], out: pathlib.Path) -> tuple[list[Cell], str | None]:
  """Runs the cells not `done`, in table order, appending each to sweep.csv as it
  ends; (every cell, the name of the signal that stopped the sweep or None)."""
  csv_path, env = out / "sweep.csv", hardware.environment()
  results, stopped = [], None
  # A stop signal stops the sweep (and the running cell) even when SIGINT was
  # inherited as ignored, as it is for a job started with `&` from a script or CI
  # runner: Python then installs no KeyboardInterrupt handler of its own.
  previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
  # Cells run smallest batch first within a model and size (the axes' order), and
  # each finished one tells the memory of the rest: a cell that will not fit is
  # recorded without being started (its own preflight refuses the first one).
  plans: dict[tuple, MemoryPlan] = {}
  started, ran, to_run = time.perf_counter(), 0, len(todo) - len(done)
  try:
    for i, cell in enumerate(todo, 1):
      if cell.id in done:
        results.append(done[cell.id])
        continue
      print(f"mpt: cell {i}/{len(todo)} {cell.id} ...", end=" ", flush=True)
      why = None if cfg.force else memoryplans.predicted_oom(plans, cell)
      if why:  # Not started: it would not fit (--force runs it).
        cell = dataclasses.replace(cell, status="OOM (predicted)", error=why, **env)
        print(f"OOM (predicted): {why}", flush=True)
      else:
        cell = dataclasses.replace(
            run_cell(cfg, cell, out, opts.cell_timeout or None), **env)
        memoryplans.learn(plans, cell)
        ran += 1
        left = console.eta(ran, to_run, time.perf_counter() - started)
        print((f"{cell.ms:.1f} ms/step" if cell.ms else cell.status) +
              (f" ({left})" if left else ""), flush=True)
      cells_lib.append_csv(csv_path, cell)
      results.append(cell)
      if cell.status == "interrupted" and cell.error in signal.Signals.__members__:
        raise Stopped(signal.Signals[cell.error].value)  # The sweep's own stop.
  except KeyboardInterrupt as e:  # During a cell (stopped above) or between cells.
    stopped = signal.Signals(getattr(e, "signum", signal.SIGINT)).name
    print("\nmpt: sweep interrupted; the table holds the cells so far (the same "
          "command resumes)", flush=True)
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
  return results, stopped


def _write_report(out: pathlib.Path, results: list[Cell], status: str,
                  after_run: AfterRun | None) -> None:
  """sweep.md, sweep.png and (by `after_run`) diagnosis.md; the table printed."""
  table = sweep_report.markdown(results)
  (out / "sweep.md").write_text(table)
  plot = sweep_report.plot(results, out / "sweep.png")
  print(table, flush=True)
  written = ["sweep.csv", "sweep.md", plot]
  if after_run is not None:
    after_run(out)
    written.insert(2, "diagnosis.md")
  print(f"mpt: {status}: {out} ({', '.join(written)})", flush=True)


def run(cfg: config.Config, opts: SweepOptions,
        after_run: AfterRun | None = None) -> dict[str, Any]:
  """`--mode=sweep`: runs the missing cells, then writes and prints the report.
  `after_run(folder)`, when given, runs last on the sweep folder (mpt/main.py passes the
  diagnosis, which a wing does not import)."""
  _check(cfg, opts)
  todo = cells(cfg, opts)
  out = sweep_dir(cfg, opts)
  out.mkdir(parents=True, exist_ok=True)
  done = {} if cfg.force else {c.id: c for c in cells_lib.read_csv(out / "sweep.csv")
                                if c.status in FINISHED}
  print(f"mpt: sweep of {len(todo)} cells in {out} ({len(done)} already finished)",
        flush=True)
  if opts.launcher == "ray":
    from mpt.sweep import cluster  # Ray: only when asked for.
    results, stopped = cluster.run_cells(cfg, opts, todo, done, out)
  else:
    results, stopped = _run_cells(cfg, opts, todo, done, out)
  status = "interrupted" if stopped else "completed"
  _write_report(out, results, status, after_run)
  failed = [c for c in results if c.status not in FINISHED]
  if failed and not stopped:
    print(f"mpt: {len(failed)} of {len(results)} cells did not complete "
          f"({', '.join(sorted({c.status for c in failed}))}): exit status "
          f"{EXIT['cells_failed']}", file=sys.stderr, flush=True)
  return {"status": status, "run_dir": str(out), "cells": len(results),
          "stop_signal": stopped, "cells_not_completed": len(failed)}
