"""Detectors that read what is known about the policy's speed before training: the
policy verdict (this model's step timed per policy, or the kernel probe), and where
nothing was measured, the CPU flags and the GPU's compute capability.

Measurement outranks the flags: when a measurement made the verdict, `slow_kernel`
and `opportunity` say which op runs slow and which policy is measured fastest, and
`hardware` (the flags' rule) stays silent.
"""

from mpt import config
from mpt.diagnose import findings as words
from mpt.diagnose import opstats
from mpt.diagnose.detectors.registry import detector
from mpt.diagnose.evidence import Evidence
from mpt.diagnose.findings import Finding
from mpt.diagnose.thresholds import HIGH_LOSS, OPPORTUNITY, SLOW_KERNELS
from mpt.diagnose.thresholds import SLOWER_THAN_FLOAT32
from mpt.machine import probe_ops
from mpt.records.cost import times
from mpt.records.verdict import PolicyVerdict


def _better_step(better: str, half: str, gpu: bool) -> str:
  if better != "float32":
    return f"--policy={better}"
  if not gpu and half == "float16":
    return ("--policy=float32 (mixed_bfloat16 is the 16-bit policy CPUs run fast, but "
            "only with AVX512_BF16 or AMX-BF16; this CPU has neither)")
  if not gpu:
    return ("--policy=float32 (or a CPU with AVX512_BF16 / AMX-BF16, e.g. Sapphire "
            "Rapids or Zen 4)")
  return ("--policy=float32 (or a GPU with compute capability >= 7.0 for float16, "
          ">= 8.0 for bfloat16)")


@detector("hardware", superseded_by=("no_tensor_cores", "tensor_cores_missed"))
def hardware(ev: Evidence) -> Finding | None:
  """No fast 16-bit path for the policy on this device, by the CPU flags or the GPU's
  compute capability: only when nothing measured the policy's speed."""
  s, caps = ev.summary, ev.summary.gpu_caps
  found = None if ev.verdict else ev.no_fast_path()
  if not found:
    return None
  reason, better = found
  half = config.SIXTEEN[s.sixteen]
  evidence = [reason, words.baseline_line(ev)]
  based_on = (["sibling runs"] if ev.baseline else []) + [
      "compute capability" if caps else "flags"]
  mb = s.microbench_gflops_by_dtype or {}
  if not caps and mb.get(half) and mb.get("float32"):
    evidence.append(f"matmul microbenchmark on this machine: {half} {mb[half]:.1f} vs "
                    f"float32 {mb['float32']:.1f} GFLOP/s "
                    f"({times(mb[half] / mb['float32'])})")
    based_on.append("microbenchmark")
  if ev.top_ops:
    evidence.append(words.top_ops_line(ev))
    based_on.append("trace")
  speedup = ev.speedup
  loss = 1 / speedup if speedup else None
  return Finding("hardware", words.loss_severity(loss),
                 1 - speedup if speedup and speedup < 1 else 0.5,
                 f"{half} has no fast path on this {'GPU' if caps else 'CPU'}",
                 "the device lacks the 16-bit instructions or Tensor Cores (no kernel "
                 "probe recorded); high when unmeasured or measured >= "
                 f"{times(HIGH_LOSS)} float32's time", evidence,
                 _better_step(better, half, bool(caps)), based_on, loss)


def _slow_words(k: PolicyVerdict, half: str) -> tuple[str, str]:
  """(the slow-kernel finding's title, its first line of evidence): the worst op and
  its kernel where the kernel table names them, else the step's measured ratio."""
  if not k.op:
    return (f"{half} runs slow here: this model's step {times(k.ratio)} float32's time",
            f"{half}: this model's step measured {times(k.ratio)} float32's time before "
            f"step 1 (no kernel table names the op: --mode=microbench lists each op's "
            f"kernel)")
  ratio = f", {times(k.op_ratio)} float32's time" if k.op_ratio else ""
  short = "oneDNN's reference kernel" if k.reference else k.impl or "?"
  kernel = (k.impl or "an unknown kernel") + (
      " (oneDNN's reference kernel)" if k.reference else "")
  return (f"{half} {k.op} runs a slow kernel here: {short}{ratio}",
          f"{half} {k.op} runs {kernel}{ratio}")


def _slow_evidence(ev: Evidence, k: PolicyVerdict, loss: float, by: str,
                   fastest: str) -> list[str]:
  policy, op = ev.summary.sixteen, k.op or "?"
  line = _slow_words(k, config.SIXTEEN[policy])[1]
  if (share := ev.traced_share(op)) is not None:
    line += f"; {share:.1%} of traced op time"
  evidence = [line]
  top = ev.top_ops
  if top and opstats.canonical_type(top[0]["type"]) != opstats.canonical_type(
      op.split("/")[0]):
    evidence.append(words.top_ops_line(ev))
  if by == "sibling runs":
    evidence.append(words.baseline_line(ev))
  else:
    evidence.append(f"{policy}: {times(loss)} float32's time by {words.rests_on(k)}; "
                    + words.baseline_line(ev))
  ratios = k.policy_ratios
  evidence.append(words.ratios_line(k.evidence, k.source, ratios) + (
      f"; {fastest} is {times(ratios[policy] / ratios[fastest])} faster than {policy} "
      f"for these ops" if ratios.get(policy) and ratios.get(fastest) else ""))
  if k.contradicts:
    evidence.append(f"{k.contradicts}: the diagnosis follows the measurement")
  return evidence


@detector("slow_kernel")
def slow_kernel(ev: Evidence) -> Finding | None:
  """A measurement put this 16-bit policy's step or ops >= SLOW_KERNELS times
  float32's here: names the worst op, its kernel and its share of the trace, and
  reruns the run under the policy measured fastest."""
  k, policy = ev.verdict, ev.summary.sixteen  # --layer_policy's 16 bits too.
  if not k or not policy or not k.slow:
    return None
  found = ev.slowdown()
  if not found or found[0] <= SLOWER_THAN_FLOAT32:
    return None  # The run itself was not slower than float32 next to it.
  loss, by = found
  fastest = k.fastest if k.fastest and k.fastest != policy else "float32"
  based_on = (["sibling runs"] if by == "sibling runs" else []) + [k.basis] + (
      ["trace"] if ev.top_ops else []) + (["flags"] if k.contradicts else [])
  return Finding(
      f"slow_kernel:{config.SIXTEEN[policy]}", words.loss_severity(loss), 1 - 1 / loss,
      _slow_words(k, config.SIXTEEN[policy])[0],
      f"{words.rests_on(k)}: >= {times(SLOW_KERNELS)} float32's time; high from "
      f"{times(HIGH_LOSS)} measured (the float32 run next to it, else the verdict)",
      _slow_evidence(ev, k, loss, by, fastest),
      ev.rerun(fastest), based_on, loss)


# The op types the kernel probe measures, as a trace names them.
_PROBED = {opstats.canonical_type(op.split("/")[0])
           for family, ops in probe_ops.FAMILIES.items() if family != "cast"
           for op in ops}


def _expected(ev: Evidence, k: PolicyVerdict, gain: float, best: str):
  """(the speed-up to expect under `best`, its evidence line, the trace was used)."""
  if ev.top_ops and k.basis == "probe":  # The step's timing covers all of the step.
    covered = sum(o["share"] for o in ev.top_ops
                  if opstats.canonical_type(o["type"]) in _PROBED)
    expected = 1 / ((1 - covered) + covered / gain)
    return expected, (f"the probed op types hold {covered:.1%} of this run's traced op "
                      f"time: expect about {times(expected)} this run's speed under "
                      f"{best} (the rest of the step does not speed up)"), True
  if k.basis == "step cost":
    return gain, (f"expect about {times(gain)} this run's speed under {best}: the whole "
                  f"step was timed"), bool(ev.top_ops)
  return gain, (f"expect up to {times(gain)} this run's speed under {best} if these ops "
                f"take the step's time (--profile_steps=A,B shows their share)"), False


@detector("opportunity", superseded_by=("slow_kernel",))
def opportunity(ev: Evidence) -> Finding | None:
  """Another policy measured >= OPPORTUNITY times faster than this run's for this
  model here (float32 runs included); superseded by `slow_kernel`, which gives the
  same advice."""
  s, k = ev.summary, ev.verdict
  ratios = k.policy_ratios if k else {}
  others = {p: r for p, r in ratios.items() if p != s.policy and r}
  if not ratios.get(s.policy) or not others:
    return None
  best = min(others, key=others.get)
  gain = ratios[s.policy] / others[best]
  if gain < OPPORTUNITY or (s.policy_choice and s.policy_choice.chosen == s.policy):
    return None  # Or --policy=auto timed the real model under each and chose this.
  if best == "float32" and ev.speedup and ev.speedup >= SLOWER_THAN_FLOAT32:
    return None  # The float32 run next to it measured slower than this one.
  expected, line, traced = _expected(ev, k, gain, best)
  evidence = [words.ratios_line(k.evidence, k.source, ratios)
              + f": {best} takes {times(1 / gain)} of {s.policy}'s time", line]
  based_on = [k.basis] + (["trace"] if traced else [])
  found = ev.slowdown() if s.sixteen else None
  loss = found[0] if found and found[1] == "sibling runs" else None
  if loss:
    evidence.append(words.baseline_line(ev))
    based_on.insert(0, "sibling runs")
  # High when the run measured >= HIGH_LOSS slower; low when the trace shows the
  # probed ops hold too little of the step for the gain to show, and low whenever it
  # rests on the probe's shapes alone: a guess never outranks a measurement.
  guess = k.basis == "probe" and not loss
  severity = ("high" if loss and loss >= HIGH_LOSS else
              "low" if expected < OPPORTUNITY or guess else "medium")
  title = (f"{best} measured {times(gain)} faster than {s.policy} for this model's step "
           "here" if k.basis == "step cost" else
           f"{best} predicted {times(gain)} faster than {s.policy} by the kernel probe's "
           "representative shapes (this model's step was not timed)")
  return Finding(
      f"opportunity:{best}", severity, 1 - 1 / expected, title,
      f"another policy >= {times(OPPORTUNITY)} faster than this run's by "
      f"{words.rests_on(k)} (low when the traced share of the probed ops leaves less "
      f"than {times(OPPORTUNITY)}, or when it rests on the probe alone)", evidence,
      # A guess is advice to measure, not to switch: the probe's shapes have put a
      # policy 1.3x slower for a model's step ahead.
      f"time {best} next to this run before switching to it: {ev.rerun(best)}"
      if guess else ev.rerun(best), based_on, loss)


@detector("tf32")
def tf32(ev: Evidence) -> Finding | None:
  """float32 on Ampere or newer runs matmuls as TF32: the baseline is not plain FP32."""
  caps, hw = ev.summary.gpu_caps, ev.summary.hardware
  if not hw or not hw.tf32 or not caps or min(caps) < (8, 0):
    return None
  cc = ".".join(map(str, min(caps)))
  return Finding(
      "tf32", "low", 0.0, "float32 matmuls run as TF32 on Tensor Cores",
      "compute capability >= 8.0 with TF32 enabled (TensorFlow's default)",
      [f"GPU compute capability {cc}, TF32 enabled: the float32 baseline already uses "
       f"Tensor Cores, so a 16-bit policy gains less over it than data-sheet FP32 "
       f"figures suggest"],
      "--notf32 for a plain FP32 baseline (slower, full float32 mantissa)",
      ["compute capability"])
