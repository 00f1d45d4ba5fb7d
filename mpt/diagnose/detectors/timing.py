"""Detectors that read the run's own timing and the utilisation sampler: steps waiting
for data, a device left idle, other processes competing for the CPU, and a FLOP rate
far below the one the microbenchmark measured here.
"""

from mpt.diagnose import findings as words
from mpt.diagnose.detectors.registry import detector
from mpt.diagnose.evidence import Evidence
from mpt.diagnose.findings import Finding
from mpt.diagnose.thresholds import (ACHIEVED_VS_MICROBENCH, INPUT_WAIT_SHARE,
                                     OTHERS_SHARE, SMALL_STEP_MS, UTILISATION)


def typical_wait(s) -> float | None:
  """The data-wait share of a typical step: the median step's (runs before mpt
  recorded it: the sum share)."""
  median = (s.step_time_ms or {}).get("data_wait_share_median")
  return median if median is not None and s.data_wait_share is not None \
      else s.data_wait_share


def _wait_lines(s, share: float) -> list[str]:
  """The data wait in words: the typical step's, the sum's, the one-off fetches."""
  stats = s.step_time_ms or {}
  wait = stats.get("data_wait_ms_median")
  of_step = (f" ({wait:.1f} ms of a {s.ms_per_step:.1f} ms step)"
             if wait is not None and s.ms_per_step else "")
  if stats.get("data_wait_share_median") is None:  # A run before mpt recorded it.
    return [f"{share:.1%} of step time waiting for the next batch"
            + of_step.replace(" (", " (median ", 1)]
  lines = [f"the median step waits {share:.1%} of its time for the next batch{of_step}"]
  if s.data_wait_share is not None and abs(s.data_wait_share - share) >= 0.01:
    apart = [f"{n} {what} ({ms:.0f} ms)" for what, (n, ms) in (
        ("epoch-start fetches", stats.get("data_wait_epoch_starts") or (0, 0)),
        ("one-off long fetches", stats.get("data_wait_one_off") or (0, 0))) if n]
    lines.append(f"summed over all steps {s.data_wait_share:.1%}"
                 + (f", of which {' and '.join(apart)}" if apart else ""))
  return lines


@detector("input_bound")
def input_bound(ev: Evidence) -> Finding | None:
  s = ev.summary
  share = typical_wait(s)
  if share is None or share < INPUT_WAIT_SHARE:
    return None
  evidence = _wait_lines(s, share)
  busy, what = s.busy()
  based_on = ["step timing"]
  if busy is not None:
    evidence.append(f"{what}: {busy:.0%}")
    based_on.append("utilisation")
  if ev.flags and ev.flags.input_work:
    step = f"drop --input_work={ev.flags.input_work} (the per-example blur passes it adds)"
  elif ev.flags and ev.flags.cache == "none":
    step = "--cache=memory (decoding and resizing run every epoch otherwise)"
  else:
    step = ("move per-example work out of the training stream (precompute it, or "
            "cache after it), or give the input pipeline its own cores")
  return Finding("input_bound", "high" if share >= 2 * INPUT_WAIT_SHARE else "medium",
                 share, "input bound: steps wait for data",
                 f"a typical step's data-wait share >= {INPUT_WAIT_SHARE:.0%} of its time"
                 if (s.step_time_ms or {}).get("data_wait_share_median") is not None
                 else f"data-wait share >= {INPUT_WAIT_SHARE:.0%} of step time",
                 evidence, step, based_on)


@detector("low_utilisation", superseded_by=("gpu_idle",))
def low_utilisation(ev: Evidence) -> Finding | None:
  """The device idles while the input pipeline keeps up: per-step overhead (short
  steps) or ops that do not use the device fully (long steps)."""
  s = ev.summary
  busy, what = s.busy()
  share = typical_wait(s) or 0.0
  if busy is None or busy >= UTILISATION or share >= INPUT_WAIT_SHARE:
    return None
  if (s.others() or 0.0) >= OTHERS_SHARE:
    return None  # Not idle: other processes had the cores (see `shared_machine`).
  ms, jit = s.ms_per_step or 0.0, bool(ev.flags and ev.flags.jit_compile)
  evidence = [f"{what}: {busy:.0%} while waiting for data only {share:.1%} of the time",
              f"{ms:.1f} ms/step at batch {s.batch_size}"
              + (f", {s.flops_per_step / 1e9:.2f} GFLOP per step"
                 if s.flops_per_step else ""), "XLA on" if jit else "XLA off"]
  if ms < SMALL_STEP_MS:
    title = "overhead bound: steps too small to keep the device busy"
    step = f"--batch_size={2 * (s.batch_size or 16)} (more work per step)"
    step += "" if jit or not _xla_may_help(ev) else (
        " or --jit_compile (fewer, fused ops per step)")
  else:
    title = "the device is idle part of each step"
    step = ("--profile_steps=A,B, then --mode=diagnose: the op statistics show which "
            "ops run long (single-threaded kernels keep the other cores idle)")
  return Finding("low_utilisation", "medium", 1 - busy, title,
                 f"utilisation < {UTILISATION:.0%} with data wait < "
                 f"{INPUT_WAIT_SHARE:.0%}; steps < {SMALL_STEP_MS:g} ms count as "
                 f"overhead", evidence, step, ["utilisation", "step timing"])


@detector("shared_machine")
def shared_machine(ev: Evidence) -> Finding | None:
  """Other processes used the CPU during the run: its timings are inflated."""
  s = ev.summary
  others = s.others()
  # On a GPU the CPU runs only the input pipeline, which `input_bound` watches.
  if others is None or others < OTHERS_SHARE or (s.hardware and s.hardware.gpus):
    return None
  busy, what = s.busy()
  return Finding(
      "shared_machine", "medium", others, "other processes competed for the CPU",
      f"other processes' share of all cores >= {OTHERS_SHARE:.0%} during the run",
      [f"the whole machine was {s.util.system_cpu_percent.mean:.0f}% busy, "
       f"this run {busy:.0%} of it ({what}): others took {others:.0%}"],
      "rerun when the machine is quiet before comparing ms/step; a sweep compares "
      "cells run one after another, so check theirs too", ["utilisation"])


@detector("achieved_rate")
def achieved_rate(ev: Evidence) -> Finding | None:
  s = ev.summary
  ratio = s.achieved_vs_microbench
  if ratio is None or ratio >= ACHIEVED_VS_MICROBENCH:
    return None
  return Finding(
      "achieved_rate", "low", 1 - ratio, "far below the measured matmul rate",
      f"achieved FLOP rate < {ACHIEVED_VS_MICROBENCH:.0%} of the microbenchmark's",
      [f"{s.achieved_gflops:.1f} GFLOP/s achieved vs {s.microbench_gflops:.1f} "
       f"GFLOP/s measured for {s.compute_dtype} matmuls ({ratio:.0%})"],
      words.where_time_goes(ev), ["microbenchmark"] + (["trace"] if ev.top_ops else []))


def _xla_may_help(ev: Evidence) -> bool:
  """Whether advice may suggest XLA: on a GPU, or where the step was measured faster
  with it here (on a CPU XLA was measured 12-29x slower: oneDNN's kernels stay
  outside it)."""
  s = ev.summary
  if s.gpu_caps:
    return True
  cost = s.cost
  own, xla = (cost.of(s.policy), cost.of(s.policy, "", True)) if cost else (None, None)
  return bool(own and xla and own.ms_per_step and xla.ms_per_step
              and xla.ms_per_step < own.ms_per_step)

