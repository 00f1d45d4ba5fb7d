"""The measured-rate cache: the best matmul GFLOP/s `--mode=microbench` measured on this
machine, per dtype, in ~/.cache/mpt/microbench/<cpu>-<n>cpu-tf<version>.json (or under
$MPT_CACHE). The microbenchmark writes it; a training run reads it, to compare its own
FLOP rate with what the machine has been measured to do.
"""

import json
import pathlib
import re
from typing import Any

from mpt import files
from mpt.machine import isa


def cache_path(cpu_name: str, logical_cpus: int, tf_version: str) -> pathlib.Path:
  """~/.cache/mpt/microbench/<cpu>-<n>cpu-tf<version>.json (or under $MPT_CACHE)."""
  key = re.sub(r"[^A-Za-z0-9]+", "_", cpu_name).strip("_")
  return files.cache_root() / "microbench" / f"{key}-{logical_cpus}cpu-tf{tf_version}.json"


def save_cache(results: dict[str, Any]) -> pathlib.Path:
  path = cache_path(results["cpu"]["name"], results["cpu"]["logical_cpus"],
                    results["tensorflow"].get("tf_version", "?"))
  path.parent.mkdir(parents=True, exist_ok=True)
  files.write_json(path, results)
  return path


def best_by_op(results: dict[str, Any], dtype: str) -> dict[str, dict[str, Any]]:
  """{op: {"gflops", "size"}}: TensorFlow's best measured rate per op type."""
  best: dict[str, dict[str, Any]] = {}
  for row in results.get("throughput") or []:
    if row.get("lib") != "tensorflow" or row.get("dtype") != dtype:
      continue
    rate = row.get("gflops")
    if isinstance(rate, (int, float)) and rate > 0 and \
        rate > best.get(row.get("op"), {}).get("gflops", 0):
      best[row.get("op")] = {"gflops": rate, "size": row.get("size")}
  return best


def measured_gflops(results: dict[str, Any], dtype: str) -> float | None:
  """The best TensorFlow matmul GFLOP/s measured for `dtype`."""
  return best_by_op(results, dtype).get("matmul", {}).get("gflops")


def cached_gflops(dtype: str) -> tuple[float | None, str | None]:
  """This machine's cached best matmul GFLOP/s for `dtype`, and the cache file."""
  import tensorflow as tf
  cpu = isa.detect()
  path = cache_path(cpu.name, cpu.logical_cpus, tf.__version__)
  try:
    return measured_gflops(json.loads(path.read_text()), dtype), str(path)
  except (OSError, ValueError):
    return None, None
