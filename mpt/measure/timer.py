"""The one timer of every measurement mpt makes before training: a model's step per
policy (the command line's, mpt/train/before_step1/cost.py; a script's, scriptcost.py;
through them the oneDNN choice, onednn_choice.py), each layer's (mpt/measure/layercost.py)
and the kernel rows (mpt/measure/gradkernels.py, mpt/machine/kernels.py's probe).

Candidates are timed interleaved. Each is made in turn (`make()`: building and tracing
its graph) and called once (its first call, where TensorFlow optimises the graph and
oneDNN creates its primitives: it counts as the trace), the baseline (the first) once
more (its step's first estimate, for the budgets); then every live candidate is
called once per round, the baseline first, so that the machine's ups and
downs fall on every candidate alike. A candidate has settled when its last WINDOW
calls agree within SPREAD of their median, as torch.utils.benchmark's
adaptive_autorange stops on IQR/median; its figure is that median.

Timing stops earlier where a budget says so: a call that would pass the calls'
budget (a function of the timings so far: a step's follows float32's step), or one
that would pass the whole measurement's, traces included (a candidate whose trace
would pass it, predicted from the baseline's, is not made at all). A candidate stopped before it settled is reported as
what it is, a bound (the baseline never is: every ratio is read against it, so it
is timed to WINDOW calls whatever the budget, and stopped unsettled its figure is the
median of its last calls, its spread said). Warm-up only adds time, so while its calls still fall its steady
call is *at most* its last (on an emulated Zen 3 a mixed_bfloat16 step took 8.9 s, then
3.1 s, and 1.2 s a step once its run had warmed up: an estimate from the second call
said 12.9x float32's time, the run measured 3.3x); calls that rise put it *at least* at
its last. Calls that neither settle nor trend within MAX_CALLS give the median of the
last WINDOW and their spread, said.
"""

import dataclasses
import math
import statistics
import time
from typing import Any, Callable, Hashable

from mpt.records import cost as cost_records

SPREAD = 0.10  # Settled: the last WINDOW calls within this share of their median.
WINDOW = 3
MAX_CALLS = 12  # Calls after the first, at most, for a candidate that never settles.
AT_MOST, AT_LEAST = cost_records.AT_MOST, cost_records.AT_LEAST
Clock = Callable[[], float]
Call = Callable[[], Any]  # One call, waiting for its work (its result read back).
Make = Callable[[], Call]  # Builds and traces a candidate: its call.


@dataclasses.dataclass
class Timing:
  """One candidate's timing."""
  first_ms: float | None = None  # Its first call (the trace's optimisation in it).
  trace_s: float | None = None  # Making it: building and tracing.
  calls: list[float] = dataclasses.field(default_factory=list)  # After the first.
  ms: float | None = None  # Its figure: settled, a bound's value, or noisy.
  bound: str | None = None  # AT_MOST / AT_LEAST where it stopped unsettled.
  spread: float | None = None  # (max - min) / median of its last WINDOW calls.
  stopped: str | None = None  # Why it stopped before it settled, failed, not timed.
  failed: bool = False

  @property
  def settled(self) -> bool:
    return self.ms is not None and self.bound is None and self.stopped is None


def spread(calls: list[float]) -> float | None:
  """(max - min) / median of the last WINDOW calls (None: fewer than WINDOW)."""
  last = calls[-WINDOW:]
  if len(last) < WINDOW or not statistics.median(last):
    return None
  return (max(last) - min(last)) / statistics.median(last)


def _settles(t: Timing) -> bool:
  found = spread(t.calls)
  if found is None or found > SPREAD:
    return False
  t.ms, t.spread = round(statistics.median(t.calls[-WINDOW:]), 4), round(found, 4)
  return True


def bound_of(t: Timing, why: str) -> None:
  """A candidate stopped unsettled: its bound from the trend of its calls, `why` said.
  Rising calls: at least its last. Else at most: its last call where the last two
  fell by more than SPREAD (a warm-up: the steady call lies below), the larger of the
  last two where they did not (a single low call is noise, not a bound); its first
  call where it made no other."""
  calls = t.calls
  t.spread = spread(calls)
  if not calls:
    t.ms, t.bound = t.first_ms, AT_MOST
  elif len(calls) >= 2 and calls[-1] > max(calls[:-1]) * (1 + SPREAD):
    t.ms, t.bound = calls[-1], AT_LEAST
  elif len(calls) >= 2 and calls[-1] < calls[-2] * (1 - SPREAD):
    t.ms, t.bound = calls[-1], AT_MOST
  else:
    t.ms, t.bound = max(calls[-2:]), AT_MOST
  t.ms = round(t.ms, 4) if t.ms is not None else None
  t.stopped = why


def _unsettled(t: Timing, baseline: bool) -> None:
  """MAX_CALLS made without settling: a trend is a bound (never the baseline's: every
  ratio is read against it), else the median of the last calls, said. A trend is the
  halves of its calls apart by more than twice SPREAD, its last WINDOW moving the
  same way (three falling calls of a noisy step are noise, not a warm-up)."""
  half = len(t.calls) // 2
  early, late = statistics.median(t.calls[:half]), statistics.median(t.calls[half:])
  last = t.calls[-WINDOW:]
  falling = late < early * (1 - 2 * SPREAD) and all(
      a > b for a, b in zip(last, last[1:]))
  rising = late > early * (1 + 2 * SPREAD) and all(a < b for a, b in zip(last, last[1:]))
  why = f"not settled within {SPREAD:.0%} in {len(t.calls)} calls"
  if not baseline and (falling or rising):
    bound_of(t, why)
  else:
    _noisy(t, why)


def _noisy(t: Timing, why: str) -> None:
  """The median of the last WINDOW calls as the figure, its spread said."""
  t.ms, t.spread = round(statistics.median(t.calls[-WINDOW:]), 4), spread(t.calls)
  t.stopped = f"{why} (spread {t.spread:.0%}): the median of its last {WINDOW}"


def failure(e: Exception) -> str:
  """A failure in one line: its type and first line (a traced function's error
  starts "in user code:" and ends with the line that says what)."""
  lines = [l.strip() for l in str(e).splitlines() if l.strip()] or [""]
  line = lines[-1] if lines[0].endswith("in user code:") else lines[0]
  return f"failed: {type(e).__name__}: {line[:200]}"


@dataclasses.dataclass
class Budget:
  """What timing may spend, in ms, given the timings so far (`allowed`), and its name
  in the line that says a stop."""
  allowed: Callable[[dict], float] = lambda timings: math.inf
  words: str = "the budget"


def latest(t: Timing | None) -> float | None:
  """A candidate's figure so far: its settled one, else its last call."""
  return t and (t.ms or (t.calls[-1] if t.calls else None))


def baseline_budget(base: Hashable, calls: float, extra_s: float, words: str) -> Budget:
  """A calls' budget that follows the baseline's figure: `calls` of its calls and
  `extra_s` more (a slow candidate gets a few calls, never dozens)."""
  return Budget(lambda timings: calls * (latest(timings[base]) or 0.0) + extra_s * 1e3,
                words)


def run(candidates: list[tuple[Hashable, Make]], *, calls: Budget = Budget(),
        total: Budget = Budget(), clock: Clock = time.perf_counter,
        catch: tuple[type, ...] = (Exception,)) -> dict[Hashable, Timing]:
  """{key: its Timing} of `candidates` ((key, make): the baseline first), timed as the
  module docstring says: `calls` bounds the calls after the first ones, `total` the
  whole measurement (traces and first calls included). A failure (`catch`) ends its
  candidate, the baseline's every candidate."""
  timings = {key: Timing() for key, _ in candidates}
  base = candidates[0][0] if candidates else None
  start, made = clock(), {}
  for key, make in candidates:
    t, b = timings[key], timings[base]
    if key != base and base not in made:
      t.stopped = "not timed: the baseline could not be timed"
      continue
    predicted = (b.trace_s or 0.0) * 1e3 + (b.first_ms or 0.0)
    if key != base and (clock() - start) * 1e3 + predicted > total.allowed(timings):
      t.stopped = f"not timed: {total.words} was spent"
      continue
    try:
      begin = clock()
      call = make()
      traced = clock()
      call()
      t.trace_s, t.first_ms = round(traced - begin, 4), round((clock() - traced) * 1e3, 4)
      made[key] = call
      if key == base:  # One call more: the budgets' first estimate of its step.
        t.calls.append(_timed(call, clock))
    except catch as e:  # pylint: disable=broad-except
      t.stopped, t.failed = failure(e), True
  _rounds([k for k, _ in candidates if k in made], base, made, timings, (calls, total),
          start, clock, catch)
  return timings


def _timed(call: Call, clock: Clock) -> float:
  begin = clock()
  call()
  return round((clock() - begin) * 1e3, 4)


def _next_ms(t: Timing, base: Timing) -> float:
  """What `t`'s next call should take: its last; after its first call alone, the
  baseline's last call scaled by their first calls (a 16-bit graph may take twice
  float32's to optimise and then run as fast: EfficientNetB0's float16 first call
  took 12.1 s against float32's 5.8, its steps 0.46 s): a prediction for the budget,
  never a figure."""
  if t.calls:
    return t.calls[-1]
  if t is base or not base.calls or not base.first_ms:
    return t.first_ms
  return base.calls[-1] * t.first_ms / base.first_ms


def _rounds(live: list, base, made: dict, timings: dict, budgets: tuple[Budget, Budget],
            start: float, clock: Clock, catch) -> None:
  """Every live candidate called once per round until each has settled or stopped
  (`budgets`: the calls', the whole measurement's since `start`)."""
  calls, total = budgets
  spent_ms = 0.0
  while live:
    for key in list(live):
      if key not in live:  # The baseline failed earlier in this round.
        continue
      t = timings[key]
      next_ms = _next_ms(t, timings[base])
      owed = key == base and len(t.calls) < WINDOW  # The baseline's figure is needed.
      over = [] if owed else [
          b.words for b, used in ((calls, spent_ms), (total, (clock() - start) * 1e3))
          if used + next_ms > b.allowed(timings)]
      if over:
        why = f"timing stopped: {over[0]} was spent"
        if key == base:
          _noisy(t, why)
        else:
          bound_of(t, why)
        live.remove(key)
        continue
      try:
        ms = _timed(made[key], clock)
      except catch as e:  # pylint: disable=broad-except
        t.stopped, t.failed = failure(e), True
        live[:] = [] if key == base else [k for k in live if k != key]
        continue
      t.calls.append(ms)
      spent_ms += ms
      if _settles(t):
        live.remove(key)
      elif len(t.calls) >= MAX_CALLS:
        _unsettled(t, key == base)
        live.remove(key)
