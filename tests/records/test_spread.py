"""Accuracy beside speed (mpt/records/spread.py): a run's final metrics against
float32's own spread over seeds, the one rule of the diagnosis, compare and sweeps."""

import dataclasses

import pytest

from mpt.records import spread
from mpt.records.summary import RunSummary


def _run(policy: str, seed: int, **metrics) -> RunSummary:
  return RunSummary(policy=policy, seed=seed, status="completed", **metrics)


@pytest.mark.parametrize("value,within", [
    (0.36, True), (0.48, True),  # The edges: 0.40..0.44 widened by 0.04 each side.
    (0.3599, False), (0.4801, False), (0.42, True)])
def test_a_metric_is_within_float32s_range_widened_by_its_width(value, within):
  base = [{"val_accuracy": a} for a in (0.40, 0.44, 0.42)]
  [judged] = spread.judge({"val_accuracy": value}, base)
  assert (judged.low, judged.high, judged.seeds, judged.within) == (0.40, 0.44, 3, within)


def test_one_float32_seed_judges_nothing_and_a_repeated_seed_counts_once():
  assert spread.judge({"val_accuracy": 0.1}, [{"val_accuracy": 0.4}]) == []
  runs = [_run("float32", 0, val_accuracy=0.4), _run("float32", 0, val_accuracy=0.5)]
  assert [r.val_accuracy for r in spread.by_seed(runs)] == [0.5]


def test_each_policy_over_seeds_beside_float32s():
  """float32 0.40 and 0.42: a window of 0.38..0.44. bfloat16's seeds 0.41 and 0.30
  (mean 0.355) are outside it; float16's 0.47 and 0.36 each alone would be, their
  mean 0.415 is not: a policy is judged by its mean over its seeds."""
  runs = [_run("float32", s, val_accuracy=a, train_loss=1.0) for s, a in
          enumerate((0.40, 0.42))] + [
      _run("mixed_bfloat16", s, val_accuracy=a, train_loss=1.0) for s, a in
      enumerate((0.41, 0.30))] + [
      _run("mixed_float16", s, val_accuracy=a, train_loss=1.0) for s, a in
      enumerate((0.47, 0.36))]
  other = [dataclasses.replace(r, batch_size=64) for r in runs[:1]]
  found = spread.across_seeds(runs + other, key=lambda r: r.batch_size)
  assert [(r.key, r.policy, r.seeds) for r in found] == [
      (None, "float32", 2), (None, "mixed_bfloat16", 2), (None, "mixed_float16", 2),
      (64, "float32", 1)]
  assert found[0].within is None and found[3].within is None
  assert found[1].within is False and found[2].within is True
  [judged] = [j for j in found[1].judged if j.metric == "val_accuracy"]
  assert (judged.value, judged.within) == (pytest.approx(0.355), False)
  assert found[1].describe() == ("train_loss 1 (1..1 over 2 seeds), val_accuracy 0.355 "
                                 "(0.3..0.41 over 2 seeds)")
