"""Detectors that read the run's precision and memory state: loss-scale trouble
(skipped steps, a collapsed scale, a NaN/Inf loss) and a memory estimate that missed
the measured peak.
"""

from mpt import config
from mpt.diagnose.detectors.registry import detector
from mpt.diagnose.evidence import Evidence
from mpt.diagnose.findings import Finding
from mpt.diagnose.thresholds import (MEMORY_DISAGREEMENT, MIN_SCALE, SETTLING_SKIPS,
                                     SKIPPED_SHARE)
from mpt.records.cost import times


@detector("loss_scale", superseded_by=("skip_cause",))
def loss_scale(ev: Evidence) -> Finding | None:
  s = ev.summary
  steps, skipped, scale = s.steps or 0, s.skipped_steps or 0, s.loss_scale
  excess = max(0, skipped - SETTLING_SKIPS)
  diverged = s.status == "diverged"
  scaled = config.scales_loss(s)  # Some layer computes in float16.
  low = scale is not None and scale < MIN_SCALE and scaled
  if not (diverged or low or (steps and excess / steps >= SKIPPED_SHARE)):
    return None
  evidence = [f"{skipped} of {steps} steps skipped for non-finite gradients, "
              f"{excess} beyond the first {SETTLING_SKIPS} ({excess / steps:.1%})"
              if steps else "no steps ran"]
  if scale is not None:
    evidence.append(f"final loss scale {scale:g}")
  if diverged:
    evidence.append(s.message or "the run stopped as diverged")
  step = ("find the layer that overflows (--mode=inspect), keep it in float32; or a "
          "fixed --loss_scale, or a lower --learning_rate" if scaled else
          "lower --learning_rate; check the data for NaN/Inf")
  return Finding("loss_scale", "high" if diverged or low else "medium",
                 excess / steps if steps else 1.0, "loss-scale trouble",
                 f"skipped steps beyond the first {SETTLING_SKIPS} >= {SKIPPED_SHARE:.0%} "
                 f"of steps, scale < {MIN_SCALE:g}, or a NaN/Inf loss", evidence, step,
                 ["loss scale"])


@detector("loss_never_scaled", needs="program")
def loss_never_scaled(ev: Evidence) -> Finding | None:
  """A script's loss-scaling optimizer applied gradients whose loss it never scaled
  (its scale_loss() never called): each update is divided by the loss scale."""
  bad = [o for o in ev.summary.program.stepped() if o.scale_loss_called is False]
  if not bad:
    return None
  evidence = [f"{o.name} ({o.cls}{' over ' + o.inner if o.inner else ''}): apply() "
              f"ran ({o.updates} updates) while scale_loss() was never called, so its "
              f"loss scale {o.loss_scale or 0:g} divides every gradient: each update "
              f"reaches the update at 1/{o.loss_scale or 0:g} of its size (Adam's normalised step hides much of that; SGD's would not train)" for o in bad]
  return Finding(
      "loss_never_scaled", "high", 1.0, "float16 loss never scaled",
      "a loss-scaling optimizer applied gradients while its scale_loss() was never called",
      evidence, "scale the loss inside the tape and take the gradients of the scaled loss: "
      "scaled = optimizer.scale_loss(loss); grads = tape.gradient(scaled, variables); "
      "optimizer.apply(grads, variables) (it unscales them and skips non-finite steps)",
      ["loss scale"])


@detector("memory_estimate")
def memory_estimate(ev: Evidence) -> Finding | None:
  """The preflight's memory estimate and the measured peak disagree by more than
  MEMORY_DISAGREEMENT: the largest-batch advice before the next run is that far off."""
  mem = ev.summary.memory
  ratio = mem.estimate_over_measured if mem else None
  if ratio is None or abs(ratio - 1) <= MEMORY_DISAGREEMENT:
    return None
  est = mem.estimate
  return Finding(
      "memory_estimate", "low", 0.0,
      f"memory estimate {times(ratio)} the measured peak",
      f"estimate and measured peak differ by more than {MEMORY_DISAGREEMENT:.0%}",
      [f"estimated {est.total_mb:.0f} MB (baseline {est.baseline_mb:.0f}, "
       f"activations {est.activations_mb_per_example * est.batch_size:.0f}, "
       f"parameters, gradients and optimizer "
       f"{est.parameters_mb + est.gradients_mb + est.optimizer_mb:.0f}), "
       f"measured peak {mem.peak_mb:.0f} MB"],
      "trust the measured peak: scale the batch by the room it leaves "
      f"({mem.available_mb or 0:.0f} MB were available)",
      ["memory"])
