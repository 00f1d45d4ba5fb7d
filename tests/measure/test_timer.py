"""The one timer (mpt/measure/timer.py) on a scripted clock: a candidate settles when its
last calls agree, stops at the budget as a bound that its trend says, and the rounds
are interleaved, the baseline first. The Zen 3 records (a MobileNetV2 script's calls
beside the ms/step its two runs measured) replayed through it give a bound that
holds, where the old estimate said 12.9x."""

import json
import math

import pytest

from helpers import DATA
from mpt.measure import timer


class Scripted:
  """A clock on which each call of candidate `key` takes the next of its scripted ms
  (the last repeats) and making it takes `trace_s`; the order of calls is logged."""

  def __init__(self, script: dict, trace_s: float = 1.0):
    self.script, self.trace_s = {k: list(v) for k, v in script.items()}, trace_s
    self.now, self.log = 0.0, []

  def __call__(self) -> float:
    return self.now

  def candidates(self):
    return [(key, self._make(key)) for key in self.script]

  def _make(self, key):
    def make():
      self.now += self.trace_s
      self.log.append((key, "make"))

      def call():
        ms = self.script[key].pop(0) if len(self.script[key]) > 1 else self.script[key][0]
        self.now += ms / 1e3
        self.log.append((key, ms))
      return call
    return make


def test_each_candidate_is_timed_until_its_last_calls_agree_interleaved():
  clock = Scripted({"a": [50, 12, 10, 10, 10], "b": [80, 40, 30, 21, 20, 20, 20]})
  found = timer.run(clock.candidates(), clock=clock)
  a, b = found["a"], found["b"]
  assert (a.first_ms, a.calls, a.ms, a.settled) == (50, [12, 10, 10, 10], 10, True)
  assert (b.first_ms, b.ms, b.settled, b.bound) == (80, 20, True, None)
  assert b.calls == [40, 30, 21, 20, 20]  # Until its last 3 agree within 10%.
  # Made and first-called in order ("a" once more, its first estimate), then one
  # call each per round, "a" first.
  calls = [k for k, what in clock.log if what != "make"]
  assert calls[:7] == ["a", "a", "b", "a", "b", "a", "b"]
  assert clock.log[0] == ("a", "make") and a.trace_s == 1.0


def test_a_candidate_stopped_by_the_budget_is_a_bound_its_trend_says():
  """Falling calls: at most the last; rising: at least the last."""
  falling = Scripted({"f32": [30, 10, 10, 10], "x": [900, 400, 250, 200, 190]})
  found = timer.run(falling.candidates(), calls=timer.Budget(lambda t: 1000), clock=falling)
  x = found["x"]
  assert x.calls == [400, 250, 200] and (x.bound, x.ms) == (timer.AT_MOST, 200)
  assert x.stopped == "timing stopped: the budget was spent" and not x.settled
  rising = Scripted({"f32": [30, 10, 10, 10], "x": [90, 40, 60, 80]})
  found = timer.run(rising.candidates(), calls=timer.Budget(lambda t: 150), clock=rising)
  assert found["x"].calls == [40, 60] and (found["x"].bound, found["x"].ms) == (
      timer.AT_LEAST, 60)


def test_the_baseline_gets_its_figure_whatever_the_budget_and_a_trace_may_not_start():
  """The first candidate is timed to WINDOW calls even past the calls' budget; a
  candidate whose trace (predicted from the baseline's) would pass the whole
  measurement's budget is not made at all."""
  clock = Scripted({"f32": [3000, 1000, 1000, 1000], "x": [10, 10, 10, 10]},
                   trace_s=2.0)
  found = timer.run(clock.candidates(), calls=timer.Budget(lambda t: 0),
                    total=timer.Budget(lambda t: 6000, "10% of the run"), clock=clock)
  assert found["f32"].settled and found["f32"].ms == 1000
  assert found["x"].stopped == "not timed: 10% of the run was spent"
  assert ("x", "make") not in clock.log


def test_a_failure_ends_its_candidate_and_the_baselines_ends_all():
  def broken():
    raise ValueError("no kernel\nmore")
  clock = Scripted({"f32": [5, 1, 1, 1]})
  found = timer.run([("f32", clock._make("f32")), ("x", lambda: broken)], clock=clock)
  assert found["x"].stopped == "failed: ValueError: no kernel" and found["x"].failed
  assert found["f32"].settled
  found = timer.run([("f32", lambda: broken), ("x", clock._make("f32"))], clock=clock)
  assert found["f32"].failed
  assert found["x"].stopped == "not timed: the baseline could not be timed"


def test_calls_that_never_settle_give_their_median_and_spread_said():
  clock = Scripted({"f32": [5] + [10, 20] * 10})
  found = timer.run(clock.candidates(), clock=clock)["f32"]
  assert len(found.calls) == timer.MAX_CALLS and found.bound is None
  assert found.ms == 20 and found.spread == pytest.approx(0.5)
  assert found.stopped == ("not settled within 10% in 12 calls (spread 50%): the "
                           "median of its last 3")


def test_the_zen3_mobilenet_script_replayed_gives_a_bound_that_holds():
  """The recorded first and second calls of each policy, then each policy's steady
  call as its run measured it (mixed_float16 had no run: its second call repeats),
  through the step cost's budget (two of float32's calls and 5 s after the first
  calls): mixed_bfloat16 stops as a bound its runs' ratio keeps (3.28x), not the
  12.9x the second call's estimate reported."""
  record = json.loads((DATA / "cost" / "amd_zen3_mobilenetv2_script.json").read_text())
  rows = {r["policy"]: r for r in record["cost_rows"]}
  runs = record["runs_ms_per_step"]
  script = {p: [rows[p]["first_ms"], rows[p]["second_ms"]] + [
      runs.get(p, rows[p]["second_ms"])] for p in ("float32", "mixed_bfloat16",
                                                   "mixed_float16")}
  clock = Scripted(script, trace_s=10.0)
  budget = lambda t: 2 * (t["float32"].ms or t["float32"].calls[-1]) + 5000
  found = timer.run(clock.candidates(), calls=timer.Budget(budget), clock=clock)
  f32, bf16 = found["float32"], found["mixed_bfloat16"]
  assert f32.ms == pytest.approx(runs["float32"])  # Its own run's figure.
  measured = runs["mixed_bfloat16"] / runs["float32"]
  assert record["reported_bf16_ratio"] == pytest.approx(12.92, abs=0.01)
  if bf16.settled:
    assert bf16.ms / f32.ms == pytest.approx(measured, rel=0.25)
  else:
    assert bf16.bound == timer.AT_MOST and bf16.ms / f32.ms >= measured
    assert bf16.ms / f32.ms < record["reported_bf16_ratio"]
  spent = sum(sum(t.calls) for t in found.values()) - sum(f32.calls[:timer.WINDOW])
  assert spent <= 2 * f32.ms + 5000  # Past float32's own figure, within the budget.
  assert math.isfinite(found["mixed_float16"].ms)


def test_a_warm_up_over_every_call_is_a_bound_and_three_falling_noisy_calls_are_not():
  """MAX_CALLS without settling: calls that fall from the first half to the second
  by more than twice SPREAD, and still fall, bound the step (at most the last); a
  noisy step whose last three calls happen to fall is its median, said."""
  warming = [3000.0 * 0.85 ** i for i in range(timer.MAX_CALLS + 1)]
  noisy = [5.0, 9.0, 6.0, 4.0, 8.0, 5.0, 9.0, 6.0, 4.0, 9.0, 7.0, 6.0, 5.0]
  clock = Scripted({"f32": [30, 10, 10, 10], "warming": warming, "noisy": noisy})
  found = timer.run(clock.candidates(), clock=clock)
  warm = found["warming"]
  assert (warm.bound, warm.ms) == (timer.AT_MOST, pytest.approx(warming[-1], rel=1e-3))
  loud = found["noisy"]
  assert loud.bound is None and loud.ms == 6.0 and loud.stopped.startswith(
      "not settled within 10% in 12 calls")
