"""Shared by the benchmark scripts: run one cell as its own `python -m mpt.main` child.

A child per cell gives every measurement fresh TensorFlow state; cells run one after
another, never concurrently, so they do not compete for the cores.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

from absl import flags


GRID_FLAGS = ("image_sizes", "policies", "batch_size", "steps", "warmup", "repeats")


def define_grid_flags() -> None:
  """The flags of a seed-convnet grid measured cell by cell (bench_loops.py,
  bench_peer.py): image sizes x policies at one batch, a median over the steps after
  warm-up, interleaved repeats. (The script declares them its key flags, GRID_FLAGS,
  for --helpshort: absl ties that to the calling module.)"""
  flags.DEFINE_list("image_sizes", ["64", "256"], "Image sizes to measure.")
  flags.DEFINE_list("policies", ["float32", "mixed_bfloat16", "mixed_float16"], "")
  flags.DEFINE_integer("batch_size", 32, "")
  flags.DEFINE_integer("steps", 30, "Train steps per cell, warm-up included.")
  flags.DEFINE_integer("warmup", 5, "Leading steps left out of the median.")
  flags.DEFINE_integer("repeats", 1, "Interleaved repeats of every cell.")


def local_cluster(workers: int) -> list[str]:
  """TF_CONFIG values for `workers` processes on this machine, one per worker, on
  free 127.0.0.1 ports (a port can be taken in between)."""
  sockets = [socket.socket() for _ in range(workers)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
  return [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
          for i in range(workers)]


def run_cell(out: str, name: str, workers: int = 1, **flags) -> dict:
  """Trains once with `flags` (plus --verbose=0) and returns its summary.json.

  `workers` > 1: that many local processes form a MultiWorkerMirroredStrategy
  cluster on 127.0.0.1 (TF_CONFIG set for each); the chief's summary is returned.
  """
  name = f"{name}_{time.strftime('%H%M%S')}"
  flags = {"checkpoint": "false", **flags}  # A benchmark cell is never resumed.
  cmd = [sys.executable, "-m", "mpt.main", "--verbose=0", f"--logdir={out}",
         f"--run_name={name}"] + [f"--{k}={v}" for k, v in flags.items()]
  if workers > 1:
    procs = [subprocess.Popen(
        cmd + ["--strategy=multi_worker"], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "TF_CONFIG": tf_config})
        for tf_config in local_cluster(workers)]
    results = [p.communicate() for p in procs]
    failed = [(p, err) for p, (_, err) in zip(procs, results) if p.returncode]
    if failed:
      raise SystemExit(f"cell failed: {' '.join(cmd)}\n{failed[0][1][-2000:]}")
  else:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
      raise SystemExit(f"cell failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
  summary = json.loads((pathlib.Path(out) / name / "summary.json").read_text())
  print(f"  {name:<40} {summary['ms_per_step']:9.1f} ms/step  "
        f"({summary['timed_steps']} timed steps, wall {summary['wall_s']:.0f} s)",
        flush=True)
  return summary
