"""`--mode=sweep`: the seed's table, from one command. Batch size x policy x loop (and
optionally image size, model, XLA), every cell its own training run in a child process.

  python -m mpt.main --mode=sweep --batch_sizes=16,32,64 \\
      --policies=float32,mixed_bfloat16 --loops=fit,custom

A child per cell gives fresh TensorFlow state, and a crash or an out-of-memory in one
cell cannot poison the next: `ResourceExhaustedError` in the child, or the child killed
by the OS (SIGKILL: the OOM killer), is recorded as `OOM`; a cell past
`--cell_timeout` seconds is killed and recorded as `timeout`; any other failure as
`failed` with its error line. The sweep goes on either way.

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
import signal
import subprocess
import sys
from typing import Any

from mpt import config
from mpt import diagnose
from mpt import injection
from mpt import sweep_report
from mpt.errors import UserError

# Config fields that define the sweep's axes and its bookkeeping, not a cell's run.
AXES = {"batch_sizes": ("batch_size", int), "policies": ("policy", str),
        "loops": ("loop", str), "image_sizes": ("image_size", int),
        "models": ("model", str), "jit_compiles": ("jit_compile", bool)}
BOOKKEEPING = ("mode", "run_name", "force", "cell_timeout", "verbose", "logdir")
FINISHED = ("ok", "OOM")


def _parse_axis(cfg: config.Config, name: str) -> list:
  field, kind = AXES[name]
  spec = getattr(cfg, name)
  if not spec:
    return [getattr(cfg, field)]
  items = [s.strip() for s in spec.split(",")]
  if "" in items:
    raise UserError(f"--{name}={spec!r} has an empty item; use a comma-separated list")
  try:
    values = [kind(s) if kind is not bool else {"true": True, "false": False}[s.lower()]
              for s in items]
  except (ValueError, KeyError):
    what = {int: "whole numbers", bool: "true/false"}.get(kind, "values")
    raise UserError(f"--{name}={spec!r} must list {what}") from None
  if len(set(values)) != len(values):
    raise UserError(f"--{name}={spec!r} lists a value twice")
  for value in values:  # Each value goes through the single-run checks.
    try:
      config.validate(dataclasses.replace(cfg, **{field: value}))
    except UserError as e:
      raise UserError(f"--{name}: {e}") from None
  return values


def cells(cfg: config.Config) -> list[dict[str, Any]]:
  """Every cell of the sweep, in table order; UserError before any cell runs."""
  axes = {AXES[name][0]: _parse_axis(cfg, name) for name in AXES}
  n_train = _dataset_size(cfg)
  too_big = [b for b in axes["batch_size"] if n_train is not None and b > n_train]
  if too_big:
    raise UserError(f"--batch_sizes: {too_big[0]} is larger than the training set "
                    f"({n_train} images)")
  keys = list(axes)
  return [dict(zip(keys, values)) for values in itertools.product(*axes.values())]


def _dataset_size(cfg: config.Config) -> int | None:
  """Training images, where known without loading the data (TFDS: not checked)."""
  if cfg.dataset == "synthetic":
    return cfg.synthetic_train
  if cfg.dataset.startswith("folder:"):
    train = pathlib.Path(cfg.dataset[len("folder:"):]).expanduser() / "train"
    return sum(1 for p in train.rglob("*") if p.is_file()) if train.is_dir() else None
  return None


def sweep_dir(cfg: config.Config) -> pathlib.Path:
  """logdir/<run_name>, or a name hashed from the flags that define the sweep."""
  if cfg.run_name:
    return pathlib.Path(cfg.logdir).expanduser() / cfg.run_name
  defining = {f.name: getattr(cfg, f.name) for f in config.fields()
              if f.name not in BOOKKEEPING}
  digest = hashlib.sha1(repr(sorted(defining.items())).encode()).hexdigest()[:8]
  return pathlib.Path(cfg.logdir).expanduser() / f"sweep-{digest}"


def _cell_flags(cfg: config.Config, cell: dict[str, Any], out: pathlib.Path) -> list[str]:
  run = dataclasses.replace(cfg, mode="train", run_name=sweep_report.cell_id(cell),
                            logdir=str(out / "cells"), verbose=0, **cell,
                            **{name: "" for name in AXES})
  return config.to_flagfile(run).splitlines()


def _error_line(stderr: str) -> str:
  lines = [l.strip() for l in stderr.splitlines() if l.strip()]
  errors = [l for l in lines if "Error" in l or l.startswith("mpt: error")]
  return (errors or lines or [""])[-1][:300]


def run_cell(cfg: config.Config, cell: dict[str, Any], out: pathlib.Path,
             timeout: float | None) -> dict[str, Any]:
  """Runs one cell as a child `python -m mpt.main`; returns its CSV row."""
  name = sweep_report.cell_id(cell)
  run_dir = out / "cells" / name
  if run_dir.exists():  # A rerun (--force, or after a failure) starts clean.
    import shutil
    shutil.rmtree(run_dir)
  cmd = [sys.executable, "-m", "mpt.main", *_cell_flags(cfg, cell, out)]
  proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, start_new_session=True)
  try:
    _, stderr = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    return {**cell, "status": "timeout", "error": f"killed after {timeout:g} s",
            "run_dir": str(run_dir)}
  except KeyboardInterrupt:  # Stop the child the way Ctrl-C stops a run.
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate()
    return {**cell, "status": "interrupted", "error": "Ctrl-C",
            "run_dir": str(run_dir)}
  row = {**cell, "run_dir": str(run_dir)}
  if proc.returncode == -signal.SIGKILL:  # Not by us: the kernel's OOM killer, mostly.
    return {**row, "status": "OOM", "error": "killed (SIGKILL)"}
  if proc.returncode and "ResourceExhaustedError" in stderr:
    return {**row, "status": "OOM", "error": _error_line(stderr)}
  if proc.returncode:
    return {**row, "status": "failed", "error": _error_line(stderr)}
  return {**row, "status": "ok", **sweep_report.from_summary(run_dir / "summary.json")}


def _stop(signum, frame):
  raise KeyboardInterrupt


def run(cfg: config.Config) -> dict[str, Any]:
  """`--mode=sweep`: runs the missing cells, then writes and prints the report."""
  config.validate(cfg)
  injection.injected_faults()  # A malformed MPT_INJECT_FAULT would fail every cell.
  todo = cells(cfg)
  out = sweep_dir(cfg)
  out.mkdir(parents=True, exist_ok=True)
  csv_path = out / "sweep.csv"
  done = {} if cfg.force else {sweep_report.cell_id(r): r
                               for r in sweep_report.read_csv(csv_path)
                               if r["status"] in FINISHED}
  env = sweep_report.environment()
  print(f"mpt: sweep of {len(todo)} cells in {out} ({len(done)} already finished)",
        flush=True)
  rows, status = [], "completed"
  # Ctrl-C and SIGTERM stop the sweep (and the running cell) even when SIGINT was
  # inherited as ignored, as it is for a job started with `&` from a script or CI
  # runner: Python then installs no KeyboardInterrupt handler of its own.
  previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
  try:
    for i, cell in enumerate(todo, 1):
      name = sweep_report.cell_id(cell)
      if name in done:
        rows.append(done[name])
        continue
      print(f"mpt: cell {i}/{len(todo)} {name} ...", end=" ", flush=True)
      row = {**run_cell(cfg, cell, out, cfg.cell_timeout or None), **env}
      print(row["status"] if row["status"] != "ok" else
            f"{float(row['ms_per_step']):.1f} ms/step", flush=True)
      sweep_report.append_csv(csv_path, row)
      rows.append(row)
      if row["status"] == "interrupted":
        raise KeyboardInterrupt
  except KeyboardInterrupt:  # During a cell (stopped above) or between cells.
    status = "interrupted"
    print("\nmpt: sweep interrupted; the table holds the cells so far (the same "
          "command resumes)", flush=True)
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
  table = sweep_report.markdown(rows)
  (out / "sweep.md").write_text(table)
  plot = sweep_report.plot(rows, out / "sweep.png")
  print(table, flush=True)
  diagnose.after_run(out)
  print(f"mpt: {status}: {out} (sweep.csv, sweep.md, diagnosis.md, {plot})", flush=True)
  return {"status": status, "run_dir": str(out), "cells": len(rows)}
