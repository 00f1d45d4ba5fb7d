"""What TF's oneDNN rewrite does for a model's kernels on this machine, for a process that
can no longer choose it: a script (mpt.callbacks, mpt.track), where TensorFlow read
TF_ENABLE_ONEDNN_OPTS once, at its first op. The command line chooses before TF starts
(mpt/train/before_step1/onednn_choice.py); a script is told what the rewrite measured
and the one line that sets it.

The ops of the model's op families (mpt/machine/probe_ops.py), forward and backward,
each in a tf.function (the rewrite acts on graphs), are timed by the one timer
(mpt/measure/timer.py) in this process and in one child process with the other
setting, in float32 and the run's 16-bit dtype; their sums per dtype are the record
(OnednnChoice `measured_ms`, "on" and "off"). Cached per machine and op families
(records/keyed.py): a machine pays it once, ~5 s on 2 cores, the child's TensorFlow
import included.
"""

import json
import os
import subprocess
import sys
import time

import tensorflow as tf

from mpt.machine import hardware
from mpt.machine import isa
from mpt.machine import probe_ops
from mpt.measure import timer
from mpt.records import cost as cost_lib
from mpt.records import keyed
from mpt.records.cost import OnednnChoice

VAR = "TF_ENABLE_ONEDNN_OPTS"
BUDGET_S = 1.0  # Each op's calls after its first ones.
CHILD = r"""
import json, sys
from mpt import console
console.import_tensorflow()
from mpt.measure import rewrite
print("MPT-REWRITE " + json.dumps(rewrite.timed(sys.argv[1].split(","),
                                                sys.argv[2].split(","))), flush=True)
"""


def timed(families: list[str], dtypes: list[str]) -> dict[str, float]:
  """{dtype: the summed ms of the families' ops} in this process, each op in a
  tf.function, settled by the one timer."""
  names = [op for f in families for op in probe_ops.FAMILIES.get(f, ()) if f != "cast"]
  found = {}
  for dtype in dtypes:
    ops = probe_ops.ops(tf, dtype)
    graphs = {op: tf.function(ops[op]) for op in names if op in ops}
    timings = timer.run([(op, lambda fn=fn: fn) for op, fn in graphs.items()],
                        calls=timer.Budget(lambda t: BUDGET_S * 1e3 * len(graphs)),
                        catch=(tf.errors.OpError, ValueError, TypeError))
    found[dtype] = round(sum(t.ms or 0.0 for t in timings.values()), 4)
  return found


def note(rewrite_on: bool, families: list[str], dtype: str) -> OnednnChoice | None:
  """Where TF leaves the rewrite off on this CPU and this process has it off: what it
  measured for these op families (cached, or measured now), as the run's choice
  record with its line; None elsewhere (nothing a script could gain)."""
  default, because = hardware.onednn_default(hardware.cpu_flags())
  if rewrite_on or default is not False or os.environ.get(VAR) is not None:
    return None
  dtypes = list(dict.fromkeys(["float32", dtype]))
  key = {"model": "kernels:" + "+".join(sorted(families)), "dtypes": dtypes,
         **cost_lib.machine_key(None, isa.detect())}
  found = keyed.cached("onednn", key, cost_lib.read_choice)
  if found is None:
    found = _measured(families, dtypes, because)
    found.key = key
    if found.measured_ms:
      keyed.save("onednn", found)
  return found


def _measured(families: list[str], dtypes: list[str], because: str) -> OnednnChoice:
  """This process's timing (the rewrite off) beside a child's with it on."""
  start = time.perf_counter()
  off = timed(families, dtypes)
  env = {**os.environ, VAR: "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
  on, why = None, ""
  try:
    proc = subprocess.run([sys.executable, "-c", CHILD, ",".join(families),
                           ",".join(dtypes)], capture_output=True, text=True, env=env,
                          timeout=300)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("MPT-REWRITE ")),
                None)
    on = json.loads(line.split(" ", 1)[1]) if line else None
    why = "" if on else (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
  except (OSError, ValueError, subprocess.TimeoutExpired) as e:
    why = str(e)[:200]
  seconds = round(time.perf_counter() - start, 1)
  if not on:
    return OnednnChoice(False, None, False, "TF's default",
                        f"{because}; measuring the rewrite failed ({why})", {}, seconds)
  return OnednnChoice(False, None, False, "TF's default", because,
                      {"on": on["float32"], "off": off["float32"]}, seconds,
                      measured="this model's op families' kernels in float32 ("
                      + ", ".join(sorted(families)) + ")")


def line(choice: OnednnChoice) -> str:
  """What the rewrite measured, and the one line that sets it."""
  ms = choice.measured_ms
  if not ms:
    return f"mpt: note: oneDNN's rewrite is off here ({choice.why})"
  faster = ms["off"] / ms["on"]
  said = (f"mpt: oneDNN's rewrite is off in this process (TF's default on this CPU); "
          f"{choice.measured} measured ~{ms['on']:.1f} ms with it, ~{ms['off']:.1f} "
          f"without ({cost_lib.times(faster)} faster with it; "
          f"{choice.source if choice.source != 'measured' else f'measured in {choice.seconds:g} s'})")
  if faster < 1 / (1 - cost_lib.ONEDNN_MARGIN):
    return said + ": TF's default is no slower here"
  return (said + f": to train with it, put `import os; os.environ[\"{VAR}\"] = \"1\"` "
          "at the top of your script, before TensorFlow is imported")
