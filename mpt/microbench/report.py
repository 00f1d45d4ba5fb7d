"""The microbenchmark's outputs: the printed report (with a second interpreter's column
and the ratio under `--compare_python`, and each peak estimate's verdict against the
best rate measured: mpt/machine/ceilings.py) and TensorBoard scalars and text.
"""

import json
import os
import pathlib
import subprocess
from typing import Any

from mpt.errors import UserError
from mpt.machine import kernels
from mpt.machine import ceilings

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The measurement under `--compare_python`'s interpreter, as one `MPT-RESULT {json}`
# line; it needs only TensorFlow and numpy there (no absl).
CHILD = r"""
import json, sys
from mpt.microbench import run
found = run.measure(**json.loads(sys.argv[1]), kernel_table=False)
print("MPT-RESULT " + json.dumps(found), flush=True)
"""


def run_other(python: str, sizes, dtypes, quick: bool) -> dict[str, Any]:
  """The same measurement under interpreter `python` (mpt from this checkout), without
  the kernel table (this interpreter's is the one training runs read)."""
  args = json.dumps({"sizes": sizes, "dtypes": dtypes, "quick": quick})
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(
      [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))}
  proc = subprocess.run([python, "-c", CHILD, args], capture_output=True, text=True,
                        env=env, cwd=ROOT)
  line = next((l for l in proc.stdout.splitlines() if l.startswith("MPT-RESULT ")), None)
  if proc.returncode or line is None:
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise UserError(f"--compare_python={python!r} could not run the microbenchmark "
                    f"(does it have TensorFlow?): {last}")
  return json.loads(line[len("MPT-RESULT "):])


def _fmt(value, spec=".1f") -> str:
  return "-" if value is None else format(value, spec)


def _key(row) -> tuple:
  return (row["op"], row["lib"], row["dtype"], str(row["size"]))


def _peak_lines(r: dict[str, Any]) -> list[str]:
  """Each dtype's estimate with its verdict in words, and the measured ceilings. Results
  recorded before ceilings existed get them computed here. With a GPU the verdict is on
  the GPU's data sheet (TensorFlow's ops ran there), not the CPU peak."""
  found = r.get("ceilings") or ceilings.ceilings(r)
  lines = []
  for d in list(r["peak"]) + [d for d in found if d not in r["peak"]]:
    p, c = r["peak"].get(d), found.get(d)
    if p:
      judged = c and c["device"] == "cpu"
      lines.append(f"  {d}: {_fmt(p['gflops'])} GFLOP/s = {p['assumptions']}" +
                   (f" -- {c['verdict']}: {c['why']}" if judged else ""))
    if c and c["device"] == "gpu":
      lines.append(f"  {d} on the GPU: {_fmt(c['estimate_gflops'])} GFLOP/s = "
                   f"{c['estimate_source']} -- {c['verdict']}: {c['why']}")
    if c and c["by_op"]:
      lines.append("    practical ceiling (best TensorFlow rate measured): " + ", ".join(
          f"{op} {b['gflops']:.1f}" for op, b in c["by_op"].items()) + " GFLOP/s")
  return lines


def _machine_lines(r: dict[str, Any], bar: str) -> list[str]:
  """The CPU, its ISA, the GPUs, TensorFlow's build and oneDNN, the kernel table."""
  lines = [f"CPU: {r['cpu']['name']} ({r['cpu']['logical_cpus']} logical CPUs, "
           f"{r['cpu']['physical_cores'] or '?'} cores, "
           f"{_fmt(r['cpu']['mhz'], '.0f')} MHz; from {r['cpu']['source']})",
           "ISA: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in r["isa"].items()
                               if not k.startswith(("asimd", "sve", "bf16")) or v)]
  for gpu in r["gpus"]:
    lines.append(f"GPU: {gpu['name']}, compute capability {gpu['compute_capability']}, "
                 f"Tensor Cores {'yes' if gpu['tensor_cores'] else 'no'}")
  t = r["tensorflow"]
  lines.append(f"TensorFlow {t.get('tf_version')}: CUDA build "
               f"{t.get('build', {}).get('is_cuda_build')}, "
               f"oneDNN {'on' if t['onednn'] else 'off'} (ISA: {t['onednn_isa']}); "
               f"not compiled to use in other operations: "
               f"{' '.join(t['not_compiled_for']) or 'none reported'}")
  for op, prims in t["onednn_dispatch"].items():
    lines.append(f"  oneDNN for {op}: {'; '.join(prims) or 'not oneDNN (Eigen kernel)'}")
  if r.get("kernels"):
    k = r["kernels"]
    lines.append(bar + f"Kernels per op (what TF dispatches; ms at a small shape, x float32; "
                 f"REF = oneDNN's reference kernel; {k.get('seconds') or '?'} s"
                 + (f"; {k['note']}" if k.get("note") else "") + "):")
    lines += kernels.format_table(k)
  return lines


def _accuracy_lines(r: dict[str, Any], bar: str) -> list[str]:
  """FMA against multiply-then-add, and 16-bit dot products' accumulation."""
  ex = r["fma_example"]
  lines = [bar + "FMA vs multiply-then-add, against exact arithmetic:"]
  for f in r["fma"]:
    lines.append(f"  {f['dtype']}: {f['differ_share']:.1%} of {f['triples']} triples "
                 f"differ; fused max {f['fused_max_ulps']:.2f} / mean "
                 f"{f['fused_mean_ulps']:.3f} ulp, unfused max {f['unfused_max_ulps']:.3g}"
                 f" / mean {f['unfused_mean_ulps']:.3g} ulp")
  lines.append(f"  example: a={ex['a']}, b={ex['b']}, c={ex['c']}: exact {ex['exact']}, "
               f"fused {ex['fused']!r}, unfused {ex['unfused']!r} ({ex['why']})")
  lines.append("16-bit dot products, 16-bit vs 32-bit accumulation (ulps of the result):")
  for d in r["dot"]:
    lines.append(f"  {d['dtype']} length {d['length']}: acc16 mean "
                 f"{d['acc16_mean_ulps']:.2f} max {d['acc16_max_ulps']:.1f}; acc32 mean "
                 f"{d['acc32_mean_ulps']:.2f} max {d['acc32_max_ulps']:.1f}")
  return lines


def _rate_lines(r: dict[str, Any], other: dict[str, Any] | None, bar: str) -> list[str]:
  """Elementwise rates, then GFLOP/s per op (and `other`'s, with the ratio)."""
  lines = [bar + "Elementwise (SIMD width), G elements/s | GB/s:"]
  for row in r["simd"]:
    lines.append(f"  {row['op']:<16} {row['lib']:<10} {row['dtype']:<8} "
                 f"{row['elements_per_s'] / 1e9:7.2f} | {row['bytes_per_s'] / 1e9:6.1f}")
  lines.append(bar + "Throughput, GFLOP/s (% of the dtype's theoretical peak)" +
               (f"; second column: {other['tensorflow'].get('tf_version')} under "
                "--compare_python" if other else ""))
  theirs = {_key(row): row for row in (other or {}).get("throughput", [])}
  for row in r["throughput"]:
    cell = (f"  {row['op']:<7} {row['lib']:<10} {row['dtype']:<8} {str(row['size']):<24} "
            f"{_fmt(row.get('gflops')):>8} ({_fmt(row['peak_share'] and 100 * row['peak_share'], '.0f')}%)")
    if row.get("skipped"):
      cell += f"  skipped: {row['skipped']}"
    if other:
      o = theirs.get(_key(row), {}).get("gflops")
      ratio = o / row["gflops"] if o and row.get("gflops") else None
      cell += f"  | {_fmt(o):>8}  x{_fmt(ratio, '.2f')}"
    lines.append(cell)
  return lines


def format_report(r: dict[str, Any], other: dict[str, Any] | None = None,
                  markdown: bool = False) -> str:
  """The whole report as text (or Markdown for TensorBoard)."""
  bar = "" if markdown else "\n"
  text = "\n".join(_machine_lines(r, bar) + [
      bar + "Peak (theoretical), judged by the best rate measured:"] + _peak_lines(r) +
      _accuracy_lines(r, bar) + _rate_lines(r, other, bar))
  return f"```\n{text}\n```" if markdown else text


def plot(r: dict[str, Any], path: pathlib.Path) -> str:
  """microbench.png: matmul GFLOP/s vs size, a line per library and dtype, the conv2d
  rates as points at their size, and each dtype's estimated peak as a dashed line
  (optional matplotlib). Returns the file name, or why there is none."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return "plot skipped: matplotlib is not installed (pip install matplotlib)"
  rows = [x for x in r["throughput"] if x.get("gflops")]
  if not rows:
    return "plot skipped: nothing measured"
  fig, ax = plt.subplots(figsize=(8, 4.5))
  colours = {}
  for lib, dtype in sorted({(x["lib"], x["dtype"]) for x in rows}):
    gemm = sorted((x["size"], x["gflops"]) for x in rows if x["op"] == "matmul"
                  and (x["lib"], x["dtype"]) == (lib, dtype) and isinstance(x["size"], int))
    if gemm:
      line, = ax.plot(*zip(*gemm), "o-" if lib == "tensorflow" else "s:",
                      label=f"matmul {lib} {dtype}")
      colours[dtype] = colours.get(dtype, line.get_color())
  for x in rows:
    if x["op"] != "matmul":
      ax.scatter([x.get("flops_size") or 256], [x["gflops"]], marker="x",
                 color=colours.get(x["dtype"], "k"), label=f"{x['op']} {x['dtype']}")
  for dtype, c in (r.get("ceilings") or {}).items():
    if c.get("estimate_gflops"):
      ax.axhline(c["estimate_gflops"], ls="--", lw=1, color=colours.get(dtype, "grey"),
                 label=f"{dtype} estimated peak")
  ax.set_xscale("log", base=2)
  ax.set_yscale("log")
  ax.set_xlabel("matrix size n (n x n x n)")
  ax.set_ylabel("GFLOP/s")
  ax.set_title(f"{r['cpu']['name']}: measured rates and estimated peaks", fontsize=9)
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=6, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path.name


def write_events(run_dir: pathlib.Path, r: dict[str, Any],
                 other: dict[str, Any] | None) -> str:
  """The report as text and microbench.png as one image (not a card per figure)."""
  import tensorflow as tf
  drawn = plot(r, run_dir / "microbench.png")
  with tf.summary.create_file_writer(str(run_dir)).as_default():
    tf.summary.text("microbench/report", format_report(r, other, markdown=True), step=0)
    if drawn == "microbench.png":
      image = tf.image.decode_png((run_dir / drawn).read_bytes(), channels=4)
      tf.summary.image("microbench/rates", image[None], step=0)
  return drawn
