"""`--mode=sweep`: the seed's table, from one command. Batch size x policy x loop (and
optionally image size, model, XLA), every cell its own training run in a child process.

  python -m mpt.main --mode=sweep --batch_sizes=16,32,64 \\
      --policies=float32,mixed_bfloat16 --loops=fit,custom

A child per cell gives fresh TensorFlow state, and a crash or an out-of-memory in one
cell cannot poison the next: `ResourceExhaustedError` in the child, or the child killed
by the OS (SIGKILL while the kernel counted an OOM kill, mpt/supervisor.py), is
recorded as `OOM`; a cell past `--cell_timeout` seconds is killed and recorded as
`timeout`; any other failure (a SIGKILL from outside too) as `failed` with its error
line. The sweep goes on either way.

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
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from mpt import config
from mpt import console
from mpt import flagvalues
from mpt import supervisor
from mpt import injection
from mpt.errors import EXIT, STOP_SIGNALS, UserError
from mpt.machine import hardware
from mpt.records import cells as cells_lib
from mpt.records.cells import Cell
from mpt.records.memory import MemoryPlan
from mpt.records.rundir import AfterRun
from mpt.sweep import memoryplans
from mpt.sweep import report as sweep_report
from mpt.sweep.options import SweepOptions

# SweepOptions fields that are the sweep's axes: (the Config field of one cell, type).
AXES = {"batch_sizes": ("batch_size", int), "policies": ("policy", str),
        "loops": ("loop", str), "image_sizes": ("image_size", int),
        "models": ("model", str), "jit_compiles": ("jit_compile", bool)}
# Fields that say where and how the sweep runs, not what it measures: left out of the
# sweep folder's default name, so that the same sweep finds its folder again.
BOOKKEEPING = ("run_name", "verbose", "logdir", "force", "cell_timeout")
# Hashed into the default name with the sweep's own flags: sweep folders already on
# disk were named from a flag set shared by all modes, these at their defaults, and
# the same command must keep finding its folder (a test pins two names).
OTHER_MODES_IN_NAME = {"run": "", "microbench_sizes": "256,512,1024,2048",
                       "microbench_dtypes": "float32,bfloat16,float16", "quick": False,
                       "compare_python": ""}
# Flags added after the naming scheme: at the value sweeps had before they existed
# (config.FLAGS_ADDED_LATER) they leave the name as it was.
NEWER_FLAGS = config.FLAGS_ADDED_LATER
FINISHED = ("ok", "OOM", "OOM (predicted)")
# mpt/main.py's step after the sweep: the diagnosis of the folder (Markdown, or None).


def _parse_axis(cfg: config.Config, opts: SweepOptions, name: str) -> list:
  field, kind = AXES[name]
  spec = getattr(opts, name)
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
  keys = list(axes)
  return [Cell(**dict(zip(keys, values)))
          for values in itertools.product(*axes.values())]


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


def _cell_flags(cfg: config.Config, cell: Cell, out: pathlib.Path) -> list[str]:
  """The child's flags: the sweep's Config with the cell's value on each axis."""
  axes = {field: getattr(cell, field) for field, _ in AXES.values()}
  # No checkpoints: a cell is never resumed (a rerun starts clean), and a sweep's
  # cells would otherwise leave megabytes each.
  run = dataclasses.replace(cfg, run_name=cell.id, logdir=str(out / "cells"),
                            verbose=0, checkpoint=False, **axes)
  return config.to_flagfile(run).splitlines()


def _error_line(stderr: str) -> str:
  lines = [l.strip() for l in stderr.splitlines() if l.strip()]
  errors = [l for l in lines if "Error" in l or l.startswith("mpt: error")]
  return (errors or lines or [""])[-1][:300]


def run_cell(cfg: config.Config, cell: Cell, out: pathlib.Path,
             timeout: float | None) -> Cell:
  """Runs one cell as a child `python -m mpt.main`; returns it with how it ended."""
  run_dir = out / "cells" / cell.id
  if run_dir.exists():  # A rerun (--force, or after a failure) starts clean.
    shutil.rmtree(run_dir)
  cmd = [sys.executable, "-m", "mpt.main", *_cell_flags(cfg, cell, out)]
  before = supervisor.oom_kills()
  proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, start_new_session=True)
  ended = lambda status, error="", **figures: dataclasses.replace(
      cell, status=status, error=error, run_dir=str(run_dir), **figures)
  try:
    _, stderr = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    return ended("timeout", f"killed after {timeout:g} s")
  except KeyboardInterrupt as e:  # Stop the child the way the signal stops a run.
    signum = getattr(e, "signum", signal.SIGINT)
    os.killpg(proc.pid, signum)
    proc.communicate()
    return ended("interrupted", signal.Signals(signum).name)
  if proc.returncode == -signal.SIGKILL:  # Not by us; the OOM killer if it counted one.
    if supervisor.oom_killed(before, supervisor.oom_kills()) is False:
      return ended("failed", "killed (SIGKILL) from outside, not by the OOM killer")
    return ended("OOM", "killed (SIGKILL)")
  if proc.returncode == supervisor.OOM_EXIT or (
      proc.returncode and "ResourceExhaustedError" in stderr):
    return ended("OOM", _error_line(stderr) or "out of memory")
  if proc.returncode == 2 and "mpt: error: memory:" in stderr:
    return ended("OOM (predicted)", _error_line(stderr))
  if proc.returncode:
    return ended("failed", _error_line(stderr))
  return ended("ok", **cells_lib.figures_from_summary(run_dir / "summary.json"))


class _Stopped(KeyboardInterrupt):
  """A stop signal (errors.STOP_SIGNALS) reached the sweep: `signum` names it."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


def _stop(signum, frame):
  raise _Stopped(signum)


def _check(cfg: config.Config, opts: SweepOptions) -> None:
  """What fails the whole sweep before any cell runs (UserError)."""
  config.validate(cfg)
  config.validate(opts)
  if cfg.policy == "auto" or "auto" in [p.strip() for p in opts.policies.split(",")]:
    raise UserError("--policy=auto is for single runs; a sweep measures every policy "
                    "anyway: --policies=float32,mixed_bfloat16,mixed_float16")
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
  previous = {sig: signal.signal(sig, _stop) for sig in STOP_SIGNALS}
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
      if cell.status == "interrupted":
        raise _Stopped(signal.Signals[cell.error].value)
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

  `after_run(folder)`, when given, runs last on the sweep folder (mpt/main.py passes
  the diagnosis, which a wing does not import).
  """
  _check(cfg, opts)
  todo = cells(cfg, opts)
  out = sweep_dir(cfg, opts)
  out.mkdir(parents=True, exist_ok=True)
  done = {} if cfg.force else {c.id: c for c in cells_lib.read_csv(out / "sweep.csv")
                                if c.status in FINISHED}
  print(f"mpt: sweep of {len(todo)} cells in {out} ({len(done)} already finished)",
        flush=True)
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
