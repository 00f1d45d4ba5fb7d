"""mpt side by side with a plain Keras script and PyTorch: ms/step of the seed convnet.

  python experiments/bench_peer.py                       # 64 and 256 px, batch 32
  python experiments/bench_peer.py --image_sizes=64 --repeats=3 --profile
  python experiments/bench_peer.py --onednns=off,auto --batchnorms=fused
  pip install -e '.[peer]'                               # PyTorch, for its columns

Cells, each its own child process (fresh state), run one after another and interleaved
over --repeats (every cell once, then all again; the figure is the median of the
repeats' medians):
  mpt fit, mpt custom    python -m mpt.main, --batchnorm from --batchnorms
  plain Keras            experiments/peers/keras_plain.py, same BatchNorm kinds
  PyTorch                experiments/peers/torch_seed.py, NCHW and channels_last, under
                         autocast for the 16-bit policies
A policy and its PyTorch dtype: float32 / float32, mixed_bfloat16 / bfloat16 autocast,
mixed_float16 / float16 autocast. Each row's `vs PyTorch` is its ms/step over PyTorch's
best of the same dtype (< 1: faster than PyTorch). Without PyTorch installed the script
says so in one line and measures the rest.

--profile adds one profiled cell each for mpt's custom step and PyTorch's channels_last
step at the first image size and the first 16-bit policy, and prints their top ops by
self time (mpt: the profile plugin's op stats, mpt/diagnose/opstats.py; PyTorch:
torch.profiler). mpt's cell uses the fused BatchNorm when it is among --batchnorms: the
profile is there to find the next difference after BatchNorm.
"""

import importlib.metadata
import importlib.util
import json
import pathlib
import statistics
import subprocess
import sys

from absl import app
from absl import flags

import benchlib
from mpt.diagnose import opstats
from mpt.machine import isa

benchlib.define_grid_flags()
for _name in benchlib.GRID_FLAGS:
  flags.declare_key_flag(_name)
flags.DEFINE_list("batchnorms", ["keras", "fused"], "BatchNorm kinds for mpt and Keras.")
flags.DEFINE_list("onednns", ["auto"], "mpt's --onednn settings (off: TF's Eigen "
                  "kernels, as on a CPU where TF leaves its oneDNN rewrite off).")
flags.DEFINE_bool("profile", False, "Top ops of mpt's and PyTorch's 16-bit step.")
flags.DEFINE_string("out", "logs/bench_peer", "Logs root for mpt's run folders.")
FLAGS = flags.FLAGS

PEERS = pathlib.Path(__file__).parent / "peers"
TORCH_DTYPE = {"float32": "float32", "mixed_bfloat16": "bfloat16",
               "mixed_float16": "float16"}
HAVE_TORCH = importlib.util.find_spec("torch") is not None


def child(script: str, **args) -> dict:
  cmd = [sys.executable, str(PEERS / script)] + [f"--{k}={v}" for k, v in args.items()
                                                  if v is not False]
  cmd = [c.removesuffix("=True") for c in cmd]
  proc = subprocess.run(cmd, capture_output=True, text=True)
  if proc.returncode:
    raise SystemExit(f"cell failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  print(f"  {script} {' '.join(cmd[2:]):<60} {result['ms_per_step']:9.1f} ms/step",
        flush=True)
  return result


def cells(size: int, policy: str):
  """(implementation label, function measuring one repeat) for one table row group."""
  common = dict(image_size=size, batch_size=FLAGS.batch_size)
  for bn in FLAGS.batchnorms:
    for loop in ("fit", "custom"):
      for dnn in FLAGS.onednns:
        label = f"mpt {loop}, {bn} BN" + (f", oneDNN {dnn}" if len(FLAGS.onednns) > 1
                                          else "")
        yield label, lambda loop=loop, bn=bn, dnn=dnn: benchlib.run_cell(
            FLAGS.out, f"{size}px_{policy}_{loop}_{bn}_{dnn}", policy=policy, loop=loop,
            batchnorm=bn, onednn=dnn, epochs=1, steps_per_epoch=FLAGS.steps,
            warmup_steps=FLAGS.warmup, synthetic_train=1300, synthetic_val=100,
            **common)["ms_per_step"]
    yield f"plain Keras, {bn} BN", lambda bn=bn: child(
        "keras_plain.py", policy=policy, batchnorm=bn, steps=FLAGS.steps,
        warmup=FLAGS.warmup, **common)["ms_per_step"]
  if HAVE_TORCH:
    for layout in ("nchw", "channels_last"):
      yield f"PyTorch {layout}", lambda layout=layout: child(
          "torch_seed.py", layout=layout, dtype=TORCH_DTYPE[policy], steps=FLAGS.steps,
          warmup=FLAGS.warmup, **common)["ms_per_step"]


def header() -> str:
  cpu = isa.detect()
  features = [f for f, on in cpu.isa().items()
              if on and f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16",
                              "amx_bf16", "amx_fp16", "asimd", "bf16", "sve")]
  versions = {name: importlib.metadata.version(name)
              for name in ("tensorflow", "keras", "torch") if _installed(name)}
  return (f"{cpu.name}, {cpu.logical_cpus} logical CPUs; ISA: {' '.join(features)}; " +
          ", ".join(f"{k} {v}" for k, v in versions.items()))


def _installed(name: str) -> bool:
  try:
    importlib.metadata.version(name)
    return True
  except importlib.metadata.PackageNotFoundError:
    return False


def table(runs: dict) -> None:
  print(f"\n{header()}\nseed_convnet, batch {FLAGS.batch_size}, median ms/step after "
        f"{FLAGS.warmup} warm-up steps of {FLAGS.steps}, median of {FLAGS.repeats} "
        "interleaved repeats\n")
  print("| px | policy | implementation | ms/step | vs PyTorch best |\n|---|---|---|---|---|")
  for size in map(int, FLAGS.image_sizes):
    for policy in FLAGS.policies:
      row = {label: statistics.median(v) for (s, p, label), v in runs.items()
             if (s, p) == (size, policy)}
      torch_best = min((ms for l, ms in row.items() if l.startswith("PyTorch")),
                       default=None)
      for label, ms in row.items():
        vs = f"{ms / torch_best:.2f}" if torch_best else "-"
        print(f"| {size} | {policy} | {label} | {ms:.1f} | {vs} |")
      mpt_best = min(ms for l, ms in row.items() if l.startswith("mpt"))
      summary = [f"mpt best {mpt_best:.1f}"]
      if torch_best:
        summary.append(f"mpt best / PyTorch best {mpt_best / torch_best:.2f}")
      dnn = f", oneDNN {FLAGS.onednns[-1]}" if len(FLAGS.onednns) > 1 else ""
      for bn in FLAGS.batchnorms:
        plain = row[f"plain Keras, {bn} BN"]
        summary += [f"mpt {loop}{dnn} / plain ({bn} BN) "
                    f"{row[f'mpt {loop}, {bn} BN{dnn}'] / plain:.2f}"
                    for loop in ("fit", "custom")]
      print(f"|   |   | *{'; '.join(summary)}* | | |")


def profiles() -> None:
  size = int(FLAGS.image_sizes[0])
  policy = next((p for p in FLAGS.policies if p != "float32"), FLAGS.policies[0])
  name = f"{size}px_{policy}_custom_profile"
  steps = max(FLAGS.steps, FLAGS.warmup + 8)
  bn = "fused" if "fused" in FLAGS.batchnorms else FLAGS.batchnorms[0]
  summary = benchlib.run_cell(
      FLAGS.out, name, policy=policy, loop="custom", batchnorm=bn,
      image_size=size, batch_size=FLAGS.batch_size, epochs=1, steps_per_epoch=steps,
      warmup_steps=FLAGS.warmup, synthetic_train=1300, synthetic_val=100,
      profile_steps=f"{FLAGS.warmup + 2},{FLAGS.warmup + 6}")
  run_dir = pathlib.Path(summary["run_dir"])
  dtypes = json.loads((run_dir / "dtypes.json").read_text())
  ours = opstats.load(run_dir, dtypes)["top_ops"]
  theirs = child("torch_seed.py", layout="channels_last", dtype=TORCH_DTYPE[policy],
                 steps=steps, warmup=FLAGS.warmup, image_size=size,
                 batch_size=FLAGS.batch_size, profile=True)["top_ops"] if HAVE_TORCH else []
  print(f"\nTop ops by self time, {size} px {policy} (mpt custom, "
        f"{bn} BN | PyTorch channels_last autocast)")
  print("| # | mpt op | share | PyTorch op | share |\n|---|---|---|---|---|")
  for i in range(max(len(ours), len(theirs))):
    a = ours[i] if i < len(ours) else {"type": "", "share": None}
    b = theirs[i] if i < len(theirs) else {"type": "", "share": None}
    fmt = lambda s: f"{s:.1%}" if s is not None else ""
    print(f"| {i + 1} | {a['type']} | {fmt(a['share'])} | {b['type']} | {fmt(b['share'])} |")


def main(argv):
  del argv
  if not HAVE_TORCH:
    print("bench_peer: PyTorch is not installed (pip install -e '.[peer]'); "
          "measuring mpt and plain Keras only", flush=True)
  runs = {}
  for _ in range(FLAGS.repeats):
    for size in map(int, FLAGS.image_sizes):
      for policy in FLAGS.policies:
        for label, measure in cells(size, policy):
          runs.setdefault((size, policy, label), []).append(measure())
  table(runs)
  if FLAGS.profile:
    profiles()


if __name__ == "__main__":
  app.run(main)
