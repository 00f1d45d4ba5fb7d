"""Detectors that read the run's measured speed against its neighbours: a 16-bit run
no faster than the float32 run next to it (when nothing before step 1 explains it),
and a run that trained with the slower of TF's two oneDNN settings.
"""

from mpt import config
from mpt.diagnose import findings as words
from mpt.diagnose.detectors.registry import detector
from mpt.diagnose.evidence import Evidence
from mpt.diagnose.findings import Finding
from mpt.diagnose.thresholds import HIGH_LOSS, ONEDNN_MARGIN, SLOWER_THAN_FLOAT32
from mpt.diagnose.thresholds import XLA_MARGIN
from mpt.records.cost import OnednnChoice, times


def _fast_here(ev: Evidence, policy: str) -> bool:
  return not config.sixteen_bit(policy) or ev.no_fast_path(policy) is None


def favoured_policy(ev: Evidence) -> tuple[str, str] | None:
  """(the policy the evidence favours over this run's, what that rests on), for a run
  with no measurement before step 1: the fastest sibling run of the same
  configuration (a 16-bit one only where the CPU flags give it a fast path), else the
  CPU flags / compute capability."""
  s = ev.summary
  ms = {p: o.ms_per_step for p, o in ev.siblings.items()
        if o.ms_per_step and _fast_here(ev, p)}
  if ms:
    best = min(ms, key=ms.get)
    flags = (f"; the CPU flags give {config.SIXTEEN[best]} a fast path"
             if config.sixteen_bit(best) else "")
    return best, (f"its sibling run under {best} measured {ms[best]:.1f} ms/step "
                  f"next to this one's {s.ms_per_step:.1f}{flags}")
  for policy in sorted(config.POLICY_DTYPE, key=lambda p: not config.sixteen_bit(p)):
    if policy != s.policy and _fast_here(ev, policy):
      return policy, ("the CPU flags / compute capability give it a fast path; no run "
                      "of it next to this one measured it")
  return None


@detector("no_speedup", superseded_by=("hardware", "slow_kernel", "opportunity"))
def no_speedup(ev: Evidence) -> Finding | None:
  """A 16-bit run measured slower than the float32 run next to it; superseded by the
  detectors that explain why (`hardware`, `slow_kernel`, `opportunity`). Without a
  measurement before step 1, a run HIGH_LOSS or more times slower gets the policy the
  evidence favours as its next step."""
  s, speedup = ev.summary, ev.speedup
  if not s.sixteen or speedup is None or speedup >= SLOWER_THAN_FLOAT32:
    return None
  evidence, based_on = [words.baseline_line(ev)], ["sibling runs"]
  step = words.where_time_goes(ev)
  k = ev.verdict
  if k:
    evidence.append(f"{words.rests_on(k)}: {times(k.ratio)} float32's time under "
                    f"{s.policy}: the kernels do not explain the loss, the rest of the "
                    "step does (casts, per-op overhead, input)")
    based_on.append(k.basis)
    step = (f"{ev.rerun('float32')} (measured faster next to it); to see where the "
            f"time goes: " + words.where_time_goes(ev, advice=False))
  elif 1 / speedup >= HIGH_LOSS:
    if favoured := favoured_policy(ev):
      why = s.not_measured.get("cost", "a run made before mpt timed the step per policy")
      evidence.append(f"nothing was measured before step 1 ({why}); {favoured[1]}")
      step = (f"{ev.rerun(favoured[0])}: the policy the evidence favours "
              f"({favoured[1]}); " + words.where_time_goes(ev, advice=False))
      based_on.append("flags")
  if ev.top_ops:
    based_on.append("trace")
  return Finding("no_speedup", words.loss_severity(1 / speedup), 1 - speedup,
                 "no speed-up over float32",
                 f"speed-up over float32 < {times(SLOWER_THAN_FLOAT32)}; high from "
                 f"{times(HIGH_LOSS)} float32's time", evidence, step, based_on,
                 1 / speedup)


@detector("onednn")
def onednn(ev: Evidence) -> Finding | None:
  """The run trained with TF's oneDNN rewrite in the setting measured slower for its
  policy (summary.json `onednn_choice`: both settings measured before step 1)."""
  s, choice = ev.summary, ev.summary.onednn_choice
  ms, ran = choice.measured_ms if choice else {}, s.onednn
  other = {"on": "off", "off": "on"}.get(ran)
  if not other or not ms.get(ran) or not ms.get(other):
    return None
  loss = ms[ran] / ms[other]
  if loss < 1 + ONEDNN_MARGIN:
    return None
  step = (f"{ev.rerun(s.policy)} --onednn={other}" if not s.script else
          f"put `import os; os.environ[\"TF_ENABLE_ONEDNN_OPTS\"] = "
          f"\"{1 if other == 'on' else 0}\"` at the top of your script, before TensorFlow "
          "is imported, and rerun it with a new run folder")
  whole = choice.measured == OnednnChoice.measured  # The step, not its kernels.
  digits, unit = (0, "ms/step") if whole else (1, "ms")
  return Finding(
      "onednn", "high" if loss >= HIGH_LOSS else "medium", 1 - 1 / loss,
      f"TF's oneDNN rewrite was {ran}, measured {times(loss)} slower than {other} here",
      f"the setting the run trained with measured >= {times(1 + ONEDNN_MARGIN)} the "
      f"other for {choice.measured} {'before' if whole else 'after'} step 1",
      [f"{choice.measured} measured ~{ms['on']:,.{digits}f} {unit} with the rewrite "
       f"on, ~{ms['off']:,.{digits}f} off; the run had it {ran} ({choice.why or '?'}; "
       f"TF_ENABLE_ONEDNN_OPTS={s.tf_enable_onednn_opts or 'unset'})"],
      step, ["step cost" if whole else "probe"], None)


def xla_steps(ev: Evidence) -> tuple[float, float] | None:
  """(the run's step with XLA, without it) in ms, as measured before step 1 for a run
  trained with --jit_compile; None where not both were measured."""
  s, cost = ev.summary, ev.summary.cost
  if not cost or not s.jit_compile:
    return None
  own, other = cost.of(s.policy, s.layer_policy), cost.of(s.policy, s.layer_policy, False)
  if not own or not other or not own.ms_per_step or not other.ms_per_step:
    return None
  return own.ms_per_step, other.ms_per_step


@detector("xla", needs="xla measured")
def xla(ev: Evidence) -> Finding | None:
  """The run trained with XLA (--jit_compile), whose step measured >= 1 + XLA_MARGIN
  times the step without it here (oneDNN's kernels outside XLA on a CPU)."""
  found = xla_steps(ev)
  if not found or found[0] < (1 + XLA_MARGIN) * found[1]:
    return None
  loss = found[0] / found[1]
  return Finding(
      "xla", "high" if loss >= HIGH_LOSS else "medium", 1 - 1 / loss,
      f"XLA (--jit_compile) measured {times(loss)} slower than without it here",
      f"the run's step with XLA >= {times(1 + XLA_MARGIN)} its step without it, both "
      "timed before step 1",
      [f"this model's step measured ~{found[0]:,.0f} ms with XLA, ~{found[1]:,.0f} "
       "without it, under the same policy and batch"],
      f"{ev.rerun(ev.summary.policy)} --nojit_compile", ["step cost"], loss)

