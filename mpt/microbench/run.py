"""`--mode=microbench`: what the CPU can do, what TensorFlow uses, and how close it gets.

  python -m mpt.main --mode=microbench                # ~1-2 min on 2 cores
  python -m mpt.main --mode=microbench --quick        # seconds, for tests
  python -m mpt.main --mode=microbench --compare_python=/opt/tf-src/bin/python

Sections, each its own module: the ISA and peak FLOP rate (mpt/machine/isa.py); TF's build, the
instructions it was not compiled for and oneDNN's dispatched ISA (tfbuild.py); FMA
and 16-bit accumulation accuracy against exact arithmetic (fma.py); elementwise SIMD
width and matmul/conv2d GFLOP/s (throughput.py); the best measured rates beside the
peak estimates, with a verdict on each estimate (`ceilings`: mpt/machine/ceilings.py).
The report (report.py) is printed, written as `microbench.json` and TensorBoard
scalars/text in a run folder, and cached per machine (mpt/machine/rates.py) so that
training runs can compare their FLOP rate with the measured one.
"""

import os
import sys
import time
from typing import Any

from mpt import config
from mpt import console
from mpt import files
from mpt import flagvalues
from mpt.errors import UserError
from mpt.machine import ceilings
from mpt.machine import kernels
from mpt.machine import rates
from mpt.microbench import options as options_lib
from mpt.microbench import report
from mpt.records import rundir

# Exact arithmetic costs ~0.1 ms per rounding in Python: the counts keep the FMA and
# dot-product sections at ~10 s.
QUICK = {"sizes": [64, 128], "simd_n": 1 << 16, "fma_n": 400,
         "dots": ((4, 50), (64, 10)), "min_time": 0.02}
FULL = {"simd_n": 1 << 24, "fma_n": 10000, "dots": ((4, 1000), (64, 100)),
        "min_time": 0.3}


def parse_sizes(spec: str, flag: str) -> list[int]:
  """A list flag of matrix sizes, each 1..16384; UserError naming what is wrong."""
  # Read as text first: a size listed twice is said before one that is no number.
  items = flagvalues.parse_list(spec, flag)
  try:
    values = [int(s) for s in items]
  except ValueError:
    raise UserError(f"--{flag}={spec!r} must list whole numbers") from None
  bad = [v for v in values if v < 1 or v > 16384]
  if bad:
    raise UserError(f"--{flag}: size {bad[0]} is out of range 1..16384")
  return values


def parse_dtypes(spec: str, flag: str, valid: tuple[str, ...]) -> list[str]:
  """A list flag of dtypes among `valid`; UserError naming what is wrong."""
  items = flagvalues.parse_list(spec, flag)
  unknown = [s for s in items if s not in valid]
  if unknown:
    raise UserError(f"--{flag}: unknown dtype {unknown[0]!r}; valid: {', '.join(valid)}")
  return items


def measure(sizes: list[int], dtypes: list[str], quick: bool,
            python: str = sys.executable, kernel_table: bool = True) -> dict[str, Any]:
  """Every section's results, for this interpreter's TensorFlow; JSON-serialisable.
  `kernel_table=False` leaves out the per-op kernel probe (a second interpreter's
  measurement: only this one's table is printed, cached and read by training runs)."""
  from mpt.machine import hardware
  from mpt.machine import isa
  from mpt.microbench import fma
  from mpt.microbench import tfbuild
  from mpt.microbench import throughput
  p = {**FULL, "sizes": sizes} if not quick else QUICK
  start = time.perf_counter()
  cpu = isa.detect()
  gpus = [{"name": name, "compute_capability": f"{cc[0]}.{cc[1]}",
           "tensor_cores": cc >= (7, 0)}
          for name, cc in zip(hardware.gpu_names(), hardware.gpu_compute_capabilities())]
  out = {
      "cpu": {"name": cpu.name, "vendor": cpu.vendor, "family": cpu.family,
              "logical_cpus": cpu.logical_cpus, "physical_cores": cpu.physical_cores,
              "mhz": cpu.mhz, "source": cpu.source},
      "isa": cpu.isa(),
      "gpus": gpus,
      "peak": {d: isa.peak_gflops(cpu, d) for d in ("float32", "bfloat16", "float16")},
      "fma_example": fma.worked_example(),
  }
  # The slow sections, each announced (and timed) as it runs.
  sections = [
      ("tensorflow", "TensorFlow's build", lambda: tfbuild.probe(python)),
      ("fma", "FMA accuracy",
       lambda: [fma.fma_accuracy(d, p["fma_n"]) for d in ("float32", "float16")]),
      ("dot", "dot-product accuracy",
       lambda: [fma.dot_accuracy(d, length, n)
                for d in ("float16", "bfloat16") for length, n in p["dots"]]),
      ("simd", "SIMD throughput", lambda: throughput.simd(p["simd_n"],
                                                          min_time=p["min_time"])),
      ("throughput", "matmul and conv2d throughput",
       lambda: (throughput.matmul(p["sizes"], dtypes, min_time=p["min_time"]) +
                throughput.conv2d(dtypes, min_time=p["min_time"]))),
  ]
  for key, label, fn in sections:
    with console.phase(f"microbench: {label}"):
      out[key] = fn()
  # Best measured rates beside the estimates, and whether each estimate holds.
  out["ceilings"] = ceilings.ceilings(out)
  # The kernels TF dispatches per op and dtype, forward and backward (its own child,
  # with ONEDNN_VERBOSE on); training runs read it from the cache for their warning.
  if kernel_table:
    with console.phase("microbench: kernels per op and dtype (ONEDNN_VERBOSE probe)"):
      out["kernels"] = kernels.probe(budget_s=0.3 if quick else kernels.BUDGET_S, python=python)
  for row in out["throughput"]:
    # TensorFlow's ops ran where the ceilings' estimate applies (the GPU when there is
    # one); numpy's always on the CPU.
    peak = (out["ceilings"].get(row["dtype"], {}).get("estimate_gflops")
            if row["lib"] == "tensorflow" else
            out["peak"].get(row["dtype"], {}).get("gflops"))
    row["peak_share"] = row["gflops"] / peak if row.get("gflops") and peak else None
  out["seconds"] = time.perf_counter() - start
  return out


def run(cfg: config.Config, opts: options_lib.MicrobenchOptions) -> dict[str, Any]:
  """`--mode=microbench`: measures, prints the report, writes the run folder (named
  after `cfg`, under its --logdir)."""
  from mpt.microbench import throughput  # TensorFlow: imported when measuring.
  config.validate(cfg)
  config.validate(opts)
  sizes = parse_sizes(opts.microbench_sizes, "microbench_sizes")
  dtypes = parse_dtypes(opts.microbench_dtypes, "microbench_dtypes",
                        throughput.GEMM_DTYPES)
  rundir.check_root(cfg)
  other, python = None, opts.compare_python
  if python:  # First: an interpreter without TF is said before the minutes of
    # measuring here, not after them (one that is no executable file, at once).
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
      raise UserError(f"--compare_python={python!r} is not an executable file")
    print(f"mpt: measuring under {python} first", flush=True)
    other = report.run_other(python, sizes, dtypes, opts.quick)
    print(f"mpt: now under this interpreter (TF {other['tensorflow'].get('tf_version')}"
          " there)", flush=True)
  results = measure(sizes, dtypes, opts.quick)
  run_dir = rundir.create(cfg, "microbench")
  summary = {"status": "completed", "run_dir": str(run_dir), **results}
  if other:
    summary["compare"] = {"python": python, "results": other}
  print(report.format_report(results, other), flush=True)
  files.write_json(run_dir / "microbench.json", summary)
  drawn = report.write_events(run_dir, results, other)
  if drawn != "microbench.png":
    print(f"mpt: {drawn}", flush=True)
  kernels.save(results["kernels"])  # This interpreter's TF, this machine's kernels.
  if opts.quick:  # Small matrices measure far below what a model's step reaches.
    print(f"mpt: wrote {run_dir / 'microbench.json'}; {results['seconds']:.0f} s. Not "
          "cached as this machine's rates (--quick's small matrices measure below "
          "what training reaches): run --mode=microbench for them", flush=True)
  else:
    cached = rates.save_cache(results)
    print(f"mpt: wrote {run_dir / 'microbench.json'} (cached as {cached}); "
          f"{results['seconds']:.0f} s", flush=True)
  return summary
