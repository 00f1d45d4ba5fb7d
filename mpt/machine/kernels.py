"""The kernel table: for each op a training step runs, forward and backward, and each of
float32, bfloat16 and float16, the kernel TensorFlow really dispatches here, its time
at a representative shape, and its ratio to float32's.

`probe()` measures it in a child process with `ONEDNN_VERBOSE=1` (the kernel names
come from oneDNN's own log, mpt/machine/onednn.py; an op oneDNN logs nothing for ran
on TF's Eigen kernels) in ~10 s on 2 cores, TensorFlow's import included. `table()`
returns it from the per-machine cache (CPU model, core count, TF version), probing
when there is none or it is unreadable or stale (a note says so). `$MPT_KERNELS`
names a recorded table that stands in for this machine's, as $MPT_CPUINFO stands in
for /proc/cpuinfo (tests use both, from real machines: tests/data/kernels/).

mpt/machine/fastpath.py turns a table into verdicts, warnings and advice.
"""

import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any, Callable

from mpt import files
from mpt.machine import isa
from mpt.machine import onednn
from mpt.machine import rates
from mpt.records.cost import times

SCHEMA = 1
DTYPES = ("float32", "bfloat16", "float16")
# Run in the child: every op of mpt/machine/probe_ops.py, marked in the log, each timed
# alone by the one timer (its calls after the first within BUDGET_S: oneDNN logs every
# call, so calls are not interleaved across ops that the log would mix up).
PROBE = r"""
import sys
from mpt import console  # As mpt imports it (TF_CPP_MIN_LOG_LEVEL=0: all lines).
console.import_tensorflow()
import tensorflow as tf
from mpt.machine import probe_ops
from mpt.measure import timer
budget = timer.Budget(lambda timings: float(sys.argv[1]) * 1e3, "the op's budget")
for d in sys.argv[2].split(","):
  print("MPT-SETUP", flush=True)  # Building the inputs logs nothing of an op.
  for name, fn in probe_ops.ops(tf, d).items():
    print(f"MPT-OP {name} {d}", flush=True)
    found = timer.run([(name, lambda fn=fn: fn)], calls=budget)[name]
    print(f"MPT-MS {found.ms}", flush=True)
print("MPT-TF " + tf.__version__, flush=True)
"""
BUDGET_S = 1.0  # Each op's calls after its first, in the probe.


def parse_probe(text: str) -> dict[str, Any]:
  """A probe child's stdout -> {"onednn_isa", "tf_version", "rows"}; never raises."""
  rows, current, logged = [], None, []

  def close():
    if current is not None:
      kernel = onednn.main_kernel(logged)
      unknown = any(p.kind == "unknown" for p in logged)
      current["impl"] = ("unknown" if unknown and kernel is None else
                         "Eigen" if kernel is None else kernel.label)
      current["reference"] = bool(kernel and kernel.reference)
      rows.append(current)

  for line in text.splitlines():
    if line.startswith("MPT-SETUP"):
      close()
      current = None
    elif line.startswith("MPT-OP "):
      close()
      _, op, dtype = line.split(" ")
      current, logged = {"op": op, "dtype": dtype, "ms": None}, []
    elif line.startswith("MPT-MS ") and current is not None:
      ms = line.split()[1]
      current["ms"] = None if ms == "None" else float(ms)
    elif current is not None and line.startswith("onednn_verbose"):
      found = onednn.parse_line(line)
      if found:
        logged.append(found)
  close()
  tf_version = next((l.split()[1] for l in text.splitlines() if l.startswith("MPT-TF ")),
                    None)
  return {"onednn_isa": onednn.isa(text), "tf_version": tf_version,
          "rows": with_ratios(rows)}


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """Each row's time over float32's for the same op (None where either is missing)."""
  base = {r["op"]: r.get("ms") for r in rows if r["dtype"] == "float32"}
  for r in rows:
    b = base.get(r["op"])
    r["ratio"] = r["ms"] / b if r.get("ms") and b else None
  return rows


def probe(budget_s: float = BUDGET_S, dtypes=DTYPES, python: str = sys.executable
          ) -> dict[str, Any]:
  """Measures the table in a child process (each op's calls after its first within
  `budget_s`); the child's failure is a table with a note, never an exception (the
  run it serves goes on)."""
  start = time.perf_counter()
  env = {**os.environ, "ONEDNN_VERBOSE": "1", "TF_CPP_MIN_LOG_LEVEL": "0"}
  try:
    proc = subprocess.run([python, "-c", PROBE, str(budget_s), ",".join(dtypes)],
                          capture_output=True, text=True, env=env, timeout=600)
    out, note = proc.stdout, (None if proc.returncode == 0 else
                              "the kernel probe failed: " +
                              (proc.stderr.strip().splitlines() or ["?"])[-1][:200])
  except (OSError, subprocess.TimeoutExpired) as e:
    out, note = "", f"the kernel probe failed: {e}"
  cpu = isa.detect()
  table = {"schema": SCHEMA, "source": "probe", "cpu": cpu.name,
           "logical_cpus": cpu.logical_cpus, **parse_probe(out),
           "seconds": round(time.perf_counter() - start, 2)}
  if note:
    table["note"] = note
  return table


def cache_path() -> pathlib.Path:
  """Next to the matmul-rate cache: same machine key, `-kernels.json`."""
  cpu = isa.detect()
  base = rates.cache_path(cpu.name, cpu.logical_cpus, files.tf_version())
  return base.with_name(base.stem + "-kernels.json")


def table(probe_if_missing: bool = True, missing: Callable[[], dict] | None = None
          ) -> tuple[dict[str, Any] | None, str | None]:
  """(this machine's kernel table, a note on where it came from or what went wrong).

  $MPT_KERNELS first (a recorded table, or `none`: nothing measured, the CPU flags
  decide), then the cache, then a fresh probe (cached); without a probe, what
  `missing()` measures instead (not cached: it is not the whole table), or None."""
  stand_in = os.environ.get("MPT_KERNELS")
  if stand_in == "none":
    return None, None
  if stand_in:
    try:
      found = json.loads(pathlib.Path(stand_in).read_text())
      return {**found, "source": f"recorded: {stand_in}"}, None
    except (OSError, ValueError) as e:
      return None, f"MPT_KERNELS={stand_in} cannot be read ({e}); no kernel table"
  path, note = cache_path(), None
  if path.exists():
    try:
      cached = json.loads(path.read_text())
      if cached.get("schema") == SCHEMA and cached.get("rows"):
        return {**cached, "source": f"cache: {path}"}, None
      note = f"the kernel cache {path} is stale (an older format); measured again"
    except (OSError, ValueError):
      note = f"the kernel cache {path} is unreadable; measured again"
  if not probe_if_missing:
    return (missing() if missing else None), note
  fresh = probe()
  save(fresh)
  return fresh, note


def save(table: dict[str, Any]) -> pathlib.Path | None:
  """Caches a measured table for this machine (not one that measured nothing)."""
  if not table.get("rows"):
    return None
  path = cache_path()
  path.parent.mkdir(parents=True, exist_ok=True)
  files.write_json(path, table)
  return path


def format_table(table: dict[str, Any]) -> list[str]:
  """One line per op: each dtype's kernel, ms and ratio to float32 (`ref` marked)."""
  by = {(r["op"], r["dtype"]): r for r in table.get("rows", [])}
  lines = [f"  {'op':<36} " + "  ".join(f"{d:<45}" for d in DTYPES)]
  for op in dict.fromkeys(r["op"] for r in table.get("rows", [])):
    cells = []
    for d in DTYPES:
      r = by.get((op, d))
      if r is None:
        cells.append(f"{'-':<44}")
        continue
      ratio = f" {times(r['ratio'])}" if r.get("ratio") and d != "float32" else ""
      ms = f"{r['ms']:.2f} ms" if r.get("ms") else "? ms"
      cells.append(f"{_short(r['impl'], d)[:30]:<30} {ms + ratio:<14}")
    lines.append(f"  {op:<36} " + "  ".join(cells))
  return lines


def _short(impl: str, dtype: str) -> str:
  """`convolution:ref:any on float16` -> `REF ref:any`; another dtype's kernel (TF's
  emulation) keeps its `on float32`."""
  kind, _, rest = impl.partition(":")
  name, _, on = (rest or kind).partition(" on ")
  out = ("REF " if name.startswith("ref") else "") + name
  return out + (f" on {on}" if on and on != dtype else "")
