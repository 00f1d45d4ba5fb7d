"""`--policy=auto`: the policy that trains this model on this data fastest here, measured.

Before the run, each candidate policy trains a few steps of the real model on the
real input pipeline (mpt's compiled custom step, fresh weights each time): its first
step (tracing included) and the median of the next `steps`. A candidate whose first
step already takes more than DROP times the best first step so far is dropped there
(float16's reference kernels on a Sapphire Rapids machine take ~200x float32's
time: one step is enough to know). The fastest candidate with a finite loss wins; the
table, the choice and what choosing cost go to summary.json (`policy_choice`) and
TensorBoard. The run then trains from scratch with the chosen policy, recorded as
that policy in flags.txt, so that --resume and a replayed flags.txt continue it.

With the step's cost per policy measured before (mpt/train/cost.py), only the
policies it leaves in doubt are timed: a policy predicted more than DOUBT times the
fastest prediction is dropped untimed, and when one policy is left it is chosen
without timing anything. On a GPU the kernel table (mpt/machine/gpu_table.py, from
the same measurement) adds each candidate's Tensor Core share to the table, and the
layers a 16-bit candidate left on CUDA cores.
"""

import math
import statistics
import time
from typing import Callable

import keras

from mpt.config import POLICY_DTYPE, Config
from mpt.machine import gpu_table
from mpt.records.gpu import GpuKernelTable
from mpt.records.verdict import Candidate, PolicyChoice
from mpt.train import precision
from mpt.train import steps as steps_lib
from mpt.train.data import Data

CANDIDATES = ("float32", "mixed_bfloat16", "mixed_float16")
DROP = 5.0
DOUBT = 1.5  # The prediction's error bound (measured within 1.5x, experiments/).


def _time_policy(policy: str, cfg: Config, data: Data, strategy, build: Callable,
                 steps: int, give_up_ms: float | None) -> Candidate:
  keras.backend.clear_session()
  keras.utils.set_random_seed(cfg.seed)
  precision.set_policy(policy)
  with strategy.scope():
    model = build()
    optimizer = precision.make_optimizer(policy, cfg.learning_rate, cfg.loss_scale)
    step = steps_lib.Steps(model, optimizer, jit_compile=cfg.jit_compile,
                           strategy=strategy, global_batch=cfg.batch_size)
  batches = iter(strategy.experimental_distribute_dataset(data.train_from(0)))
  times, loss = [], None
  for i in range(steps + 1):
    start = time.perf_counter()
    loss = float(step.train_step(*next(batches))["loss"])
    times.append((time.perf_counter() - start) * 1e3)
    if i == 0 and give_up_ms is not None and times[0] > give_up_ms:
      return Candidate(policy, times[0], None, math.isfinite(loss),
                       f"first step > {DROP:g}x the best so far ({times[0]:.0f} ms)")
  return Candidate(policy, times[0], statistics.median(times[1:]), math.isfinite(loss))


def _untimed(predicted: dict[str, float] | None) -> dict[str, Candidate]:
  """The candidates the prediction rules out, as rows that say why."""
  if not predicted or not all(predicted.get(p) for p in CANDIDATES):
    return {}
  best = min(predicted.values())
  return {p: Candidate(p, dropped=f"predicted {predicted[p] / best:.2g}x the fastest "
                                 f"(~{predicted[p]:,.0f} ms/step): not timed",
                       predicted_ms=predicted[p])
          for p in CANDIDATES if predicted[p] > DOUBT * best}


def _kernels(rows: list[Candidate], kernels: GpuKernelTable | None) -> None:
  """Each candidate's Tensor Core share and CUDA-core layers, from the GPU's table."""
  if kernels is None:
    return
  table = kernels.as_table()
  for r in rows:
    dtype = POLICY_DTYPE[r.policy]
    r.tensor_cores = gpu_table.eligible_on_tensor_cores(kernels, dtype)
    missed = gpu_table.missed(table, dtype)
    if missed and missed[0] >= gpu_table.MISSED:
      r.cuda_cores_layers = missed[1]


def choose(cfg: Config, data: Data, strategy, build: Callable[[], keras.Model],
           steps: int = 3, predicted: dict[str, float] | None = None,
           kernels: GpuKernelTable | None = None) -> tuple[str, PolicyChoice]:
  """(the chosen policy, the record of the choice); `build()` makes the model;
  `predicted`: each policy's predicted ms/step, when measured; `kernels`: the kernel
  table on a GPU (each candidate's Tensor Core share, shown in the table)."""
  start, rows, best_first = time.perf_counter(), [], None
  untimed = _untimed(predicted)
  in_doubt = [p for p in CANDIDATES if p not in untimed]
  for policy in CANDIDATES:
    if policy in untimed:
      rows.append(untimed[policy])
      continue
    if len(in_doubt) == 1:  # The prediction alone decides.
      rows.append(Candidate(policy, ms_per_step=predicted[policy],
                            predicted_ms=predicted[policy]))
      continue
    row = _time_policy(policy, cfg, data, strategy, build, steps,
                       DROP * best_first if best_first else None)
    row.predicted_ms = (predicted or {}).get(policy)
    rows.append(row)
    if row.ms_per_step is not None and row.finite:
      best_first = min(best_first or row.first_ms, row.first_ms)
  usable = [r for r in rows if r.ms_per_step is not None and r.finite]
  chosen = min(usable, key=lambda r: r.ms_per_step).policy if usable else "float32"
  base = next((r.ms_per_step for r in rows if r.policy == "float32"), None)
  for r in rows:
    r.vs_float32 = base / r.ms_per_step if base and r.ms_per_step else None
  _kernels(rows, kernels)
  keras.backend.clear_session()
  return chosen, PolicyChoice("auto", chosen, steps if len(in_doubt) > 1 else 0, rows,
                              round(time.perf_counter() - start, 2))


def format_table(choice: PolicyChoice, markdown: bool = False) -> str:
  """The candidates as a table: ms/step, speed vs float32, first step, why dropped."""
  gpu = any(r.tensor_cores is not None for r in choice.candidates)
  head = ("| policy | ms/step | speed vs float32 | first step ms |"
          + (" on Tensor Cores |" if gpu else "") + " note |")
  lines = [head, "|---|---|---|---|" + ("---|" if gpu else "") + "---|"] if markdown \
      else [head]
  for r in choice.candidates:
    ms = f"{r.ms_per_step:.1f}" if r.ms_per_step else "-"
    vs = f"{r.vs_float32:.2f}x" if r.vs_float32 else "-"
    note = r.dropped or ("non-finite loss" if not r.finite else
                         "chosen" if r.policy == choice.chosen else "")
    first = f"{r.first_ms:.0f}" if r.first_ms is not None else "-"
    if r.first_ms is None and r.ms_per_step and not r.dropped:
      note = "chosen on its predicted cost, not timed"
    if r.cuda_cores_layers:
      note = "; ".join(filter(None, [note, "CUDA cores: " + ", ".join(r.cuda_cores_layers)]))
    cores = (f" {r.tensor_cores:.0%} |" if r.tensor_cores is not None else " - |") if gpu else ""
    lines.append(f"| {r.policy} | {ms} | {vs} | {first} |{cores} {note} |")
  lines.append(f"choosing took {choice.seconds:.1f} s")
  return "\n".join(lines)
