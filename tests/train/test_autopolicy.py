"""The measured warning before step 1 and `--policy=auto`, on recorded kernel tables
(tests/data/kernels) standing in for this machine's; nothing here times anything."""

import contextlib
import json
import math
import types

import keras
import pytest

from mpt import config
from mpt.errors import UserError
from mpt.sweep import run as sweep
from mpt.sweep.options import SweepOptions
from mpt.train import autopolicy

from helpers import CPUINFO, DATA, mpt_forked, read_events, tiny_flags, train_run


SPR = "intel_spr_amx_recorded"  # Its cpuinfo and kernel table, recorded together.


def _run(tmp_path, *flags, kernels=None, fault=None, status=0, cpuinfo=None):
  """The command line's run, in a process forked from a server that imported
  TensorFlow (helpers.mpt_forked): mpt reads MPT_KERNELS, MPT_CPUINFO and
  MPT_INJECT_FAULT at run time."""
  env = {**({"MPT_KERNELS": str(DATA / "kernels" / kernels)} if kernels else {}),
         **({"MPT_CPUINFO": str(CPUINFO / cpuinfo)} if cpuinfo else {}),
         **({"MPT_INJECT_FAULT": fault} if fault else {})}
  proc = mpt_forked(*tiny_flags(tmp_path, "--epochs=1", *flags), env=env)
  assert proc.returncode == status, proc.stderr[-3000:]
  return proc.stdout


def test_the_users_command_warns_once_before_step_1_on_spr_evidence(tmp_path):
  # The recorded Sapphire Rapids, whatever the session's stand-in (pytest --cpuinfo).
  spr = dict(kernels=f"{SPR}.json", cpuinfo=f"{SPR}.txt")
  # A failure injected just before the loop starts: the warning is out already.
  early = _run(tmp_path / "early", "--policy=mixed_float16", "--loop=custom",
               fault="fail:4", status=1, **spr)
  assert [l for l in early.splitlines() if l.startswith("WARNING: mixed_float16")]
  out = _run(tmp_path, "--policy=mixed_float16", "--loop=custom", **spr)
  warnings = [l for l in out.splitlines() if l.startswith("WARNING: mixed_float16")]
  assert len(warnings) == 1, out
  for words in ("Conv2DBackpropFilter", "ref:any", "--policy=mixed_bfloat16",
                "promise a fast float16 path"):
    assert words in warnings[0], (words, warnings[0])
  run = next(p for p in (tmp_path / "logs").iterdir() if p.is_dir())  # Not runs.csv.
  summary = json.loads((run / "summary.json").read_text())
  assert summary["slow_path_warning"] == warnings[0][len("WARNING: "):]
  verdict = summary["policy_verdict"]
  assert verdict["evidence"] == "probe" and verdict["slow"]
  assert "intel_spr_amx_recorded.json" in verdict["source"]


@pytest.mark.parametrize("kernels,policy", [
    ("nothing_slow_synthetic.json", "mixed_float16"),
    ("intel_spr_amx_recorded.json", "mixed_bfloat16")])
def test_no_warning_where_nothing_is_measured_slow(tmp_path, kernels, policy):
  out = _run(tmp_path, f"--policy={policy}", kernels=kernels)
  assert "WARNING: mixed" not in out, out


def test_auto_picks_the_fastest_finite_candidate_and_records_it(tiny, tmp_path):
  """Timed for real, so which policy is fastest is this host's: the choice is checked
  against the recorded times and the records of the run that trained with it (the
  choice itself against literals on a scripted clock: the tests below)."""
  run = train_run(tiny(policy="auto", epochs=1, loop="custom"))["run_dir"]
  summary = json.loads(open(f"{run}/summary.json").read())  # What tools read.
  choice = summary["policy_choice"]
  assert (choice["requested"], choice["steps_timed"]) == ("auto", 3)
  # float32 first: the others are judged against its first step and speed.
  assert [r["policy"] for r in choice["candidates"]] == [
      "float32", "mixed_bfloat16", "mixed_float16"]
  rows = {r["policy"]: r for r in choice["candidates"]}
  usable = {p: r["ms_per_step"] for p, r in rows.items()
            if r["ms_per_step"] is not None and r["finite"]}
  assert choice["chosen"] == min(usable, key=usable.get)
  assert choice["seconds"] > 0 and rows["float32"]["vs_float32"] == 1.0
  assert rows["float32"]["first_ms"] > 0 and rows["float32"]["dropped"] is None
  # The run trained under the chosen policy: its flags, and its layers' dtypes.
  flags = open(f"{run}/flags.txt").read()
  assert f"--policy={choice['chosen']}\n" in flags and "--policy=auto" not in flags
  compute = {"float32": "float32", "mixed_bfloat16": "bfloat16",
             "mixed_float16": "float16"}[choice["chosen"]]
  assert (summary["policy"], summary["compute_dtype"]) == (choice["chosen"], compute)
  layers = json.loads(open(f"{run}/dtypes.json").read())["layers"]
  assert compute in {l["compute_dtype"] for l in layers}
  assert "precision/policy_choice" in read_events(run)


class ScriptedClock:
  """autopolicy's `time` module: a clock that moves only when a fake step runs."""

  def __init__(self):
    self.now = 0.0

  def perf_counter(self) -> float:
    return self.now


def choose_on(monkeypatch, clock, steps_class, **kwargs):
  """autopolicy.choose with `steps_class` for mpt's compiled steps, on `clock`: one
  device, a dataset of empty batches, no model."""

  class Strategy:
    scope = staticmethod(contextlib.nullcontext)
    experimental_distribute_dataset = staticmethod(lambda ds: ds)

  data = types.SimpleNamespace(train_from=lambda step: iter([(None, None)] * 10))
  monkeypatch.setattr(autopolicy, "time", clock)
  monkeypatch.setattr(autopolicy.steps_lib, "Steps", steps_class)
  return autopolicy.choose(config.Config(), data, Strategy(), lambda: None, **kwargs)


def test_auto_drops_a_candidate_whose_first_step_is_too_slow_and_a_non_finite_one(
    monkeypatch):
  """The real timing and drop rule (autopolicy._time_policy) on a scripted clock:
  each policy's steps take the scripted ms (first step, then the rest) and end with
  the scripted loss. Nothing is trained."""
  script = {"float32": ([1000.0, 100.0, 110.0, 90.0], 0.5),
            "mixed_bfloat16": ([900.0, 60.0, 60.0, 60.0], float("nan")),
            "mixed_float16": ([6000.0, 30.0, 30.0, 30.0], 0.5)}
  clock, ran = ScriptedClock(), {}

  class Steps:  # mpt's compiled steps: here a step is the clock moving on.
    def __init__(self, model, optimizer, **kwargs):
      self.policy = keras.mixed_precision.global_policy().name
      self.times = iter(script[self.policy][0])

    def train_step(self, images, labels):
      clock.now += next(self.times) / 1e3
      ran[self.policy] = ran.get(self.policy, 0) + 1
      return {"loss": script[self.policy][1]}
  chosen, choice = choose_on(monkeypatch, clock, Steps)
  rows = {r.policy: r for r in choice.candidates}
  # bfloat16 is fastest but its loss was not finite; float16's first step was more
  # than 5x the best usable first step (float32's 1000 ms), so it stopped there.
  assert chosen == "float32" and ran == {"float32": 4, "mixed_bfloat16": 4,
                                         "mixed_float16": 1}
  assert rows["float32"].ms_per_step == pytest.approx(100.0)  # Median of the rest.
  assert rows["mixed_bfloat16"].finite is False and rows["mixed_bfloat16"].dropped is None
  assert rows["mixed_float16"].ms_per_step is None
  assert rows["mixed_float16"].dropped == "first step > 5x the best so far (6000 ms)"
  table = autopolicy.format_table(choice)
  assert "non-finite loss" in table and "first step > 5x" in table and "chosen" in table
  assert math.isclose(rows["mixed_bfloat16"].vs_float32, 100 / 60)
  assert choice.seconds == pytest.approx(1.3 + 1.08 + 6.0)  # On the scripted clock.


@pytest.mark.parametrize("predicted,timed,chosen", [
    # bfloat16 predicted fastest; float32 within 1.5x of it is in doubt, float16 not.
    ({"float32": 100.0, "mixed_bfloat16": 80.0, "mixed_float16": 400.0},
     {"float32", "mixed_bfloat16"}, "mixed_bfloat16"),
    # Nothing within 1.5x of bfloat16's prediction: chosen without timing anything.
    ({"float32": 130.0, "mixed_bfloat16": 80.0, "mixed_float16": 400.0}, set(),
     "mixed_bfloat16"),
])
def test_a_measured_cost_leaves_only_the_policies_in_doubt_to_time(
    predicted, timed, chosen, monkeypatch):
  ran, clock = set(), ScriptedClock()

  class Steps:  # A step is the clock moving on by the prediction: it was right.
    def __init__(self, model, optimizer, **kwargs):
      self.policy = keras.mixed_precision.global_policy().name

    def train_step(self, images, labels):
      ran.add(self.policy)
      clock.now += predicted[self.policy] / 1e3
      return {"loss": 0.5}
  got, choice = choose_on(monkeypatch, clock, Steps, predicted=predicted)
  rows = {r.policy: r for r in choice.candidates}
  assert ran == timed and got == chosen
  assert rows["mixed_float16"].dropped == ("predicted 5x the fastest (~400 ms/step): "
                                           "not timed")
  assert choice.steps_timed == (3 if timed else 0)
  table = autopolicy.format_table(choice)
  assert ("chosen on its predicted cost, not timed" in table) is (not timed)


def test_auto_is_for_single_training_runs(tiny, tmp_path):
  with pytest.raises(UserError, match="--policy=auto is for single runs"):
    sweep.run(tiny(policy="auto"), SweepOptions())
  with pytest.raises(UserError, match="--policy=auto is for single runs"):
    sweep.run(tiny(), SweepOptions(policies="float32,auto"))
  from mpt.train import dryrun
  with pytest.raises(UserError, match="use it with --mode=train"):
    dryrun.inspect_only(tiny(policy="auto"))
