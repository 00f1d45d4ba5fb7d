"""What TensorFlow actually uses: its build, the instructions it says it was not
compiled for, and the kernels oneDNN dispatches for float32, bfloat16 and float16
matmul and conv (the full per-op table, backward ops included, is
mpt/machine/kernels.py).

Run in a child process (`python -c PROBE`), because the facts come from what TF and
oneDNN print at start-up and per primitive: `ONEDNN_VERBOSE=1` makes oneDNN print its
ISA and one line per executed primitive (its implementation and memory dtypes). The
child can be another interpreter (`--compare_python`), e.g. a source-built TF.
"""

import json
import os
import re
import subprocess

from mpt.machine import onednn

PROBE = r"""
import json, sys
from mpt import console  # As mpt imports it (TF_CPP_MIN_LOG_LEVEL=0: all lines).
console.import_tensorflow()
import tensorflow as tf
for dtype in ("float32", "bfloat16", "float16"):
  a = tf.cast(tf.ones((128, 128)), dtype)
  print(f"MPT-OP matmul {dtype}", flush=True)
  tf.linalg.matmul(a, a).numpy()
  x = tf.cast(tf.ones((1, 16, 16, 16)), dtype)
  k = tf.cast(tf.ones((3, 3, 16, 16)), dtype)
  print(f"MPT-OP conv2d {dtype}", flush=True)
  tf.nn.conv2d(x, k, 1, "SAME").numpy()
print("MPT-INFO " + json.dumps({"tf_version": tf.__version__,
                                "python": sys.version.split()[0],
                                "build": dict(tf.sysconfig.get_build_info())}))
"""


def parse(stdout: str, stderr: str) -> dict:
  """The facts in a PROBE child's output."""
  not_used = re.search(r"To enable the following instructions: (.*?), in other "
                       r"operations", stderr)
  isa = onednn.isa(stdout)
  onednn_on = "oneDNN custom operations are on" in stderr or bool(isa)
  ops, current = {}, None
  for line in stdout.splitlines():
    if line.startswith("MPT-OP "):
      current = line.split(" ", 1)[1].replace(" ", "_")
      ops[current] = []
    elif current and line.startswith("onednn_verbose"):
      primitive = onednn.parse_line(line)
      if primitive and primitive.kind not in onednn.LAYOUT_ONLY:
        entry = primitive.label if primitive.kind != "unknown" else "unknown"
        if entry not in ops[current]:
          ops[current].append(entry)
  info = next((json.loads(l[len("MPT-INFO "):]) for l in stdout.splitlines()
               if l.startswith("MPT-INFO ")), {})
  return {
      **info,
      "not_compiled_for": not_used.group(1).split() if not_used else [],
      "onednn": onednn_on,
      "onednn_isa": isa,
      # Per op and dtype, the oneDNN primitives that ran (implementation, source
      # dtype); empty: oneDNN did not run it (Eigen did).
      "onednn_dispatch": ops,
  }


def probe(python: str) -> dict:
  """Runs PROBE under `python` with ONEDNN_VERBOSE=1 and returns `parse`'s facts."""
  env = {**os.environ, "ONEDNN_VERBOSE": "1", "TF_CPP_MIN_LOG_LEVEL": "0"}
  proc = subprocess.run([python, "-c", PROBE], capture_output=True, text=True,
                        env=env, timeout=300)
  if proc.returncode:
    raise RuntimeError(f"TensorFlow probe failed under {python}: "
                       f"{proc.stderr.strip().splitlines()[-1:]}")
  return parse(proc.stdout, proc.stderr)
