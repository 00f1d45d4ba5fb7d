"""The measured warning before step 1 and `--policy=auto`, on recorded kernel tables
(tests/data/kernels) standing in for this machine's; nothing here times anything."""

import dataclasses
import json
import math
import pathlib
import re
import sys

import keras
import pytest

from mpt import config
from mpt.errors import UserError
from mpt.sweep import run as sweep
from mpt.sweep.options import SweepOptions
from mpt.records import summary as summary_lib
from mpt.records.cost import Cost, PolicyCost
from mpt.records.layers import Plan
from mpt.train.before_step1 import autopolicy

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
  assert summary["policy_verdict"]["text"] == warnings[0][len("WARNING: "):]
  verdict = summary["policy_verdict"]
  assert verdict["evidence"] == "probe" and verdict["slow"]
  assert "intel_spr_amx_recorded.json" in verdict["source"]


@pytest.mark.parametrize("kernels,policy", [
    ("nothing_slow_synthetic.json", "mixed_float16"),
    ("intel_spr_amx_recorded.json", "mixed_bfloat16")])
def test_no_warning_where_nothing_is_measured_slow(tmp_path, kernels, policy):
  out = _run(tmp_path, f"--policy={policy}", kernels=kernels)
  assert "WARNING: mixed" not in out, out


def test_auto_picks_the_fastest_finite_candidate_and_records_it(tiny, monkeypatch):
  """Measured for real (the step's cost, the one measurement before step 1), so which
  policy is fastest is this host's: the choice is checked against the measurement
  and the records of the run that trained with it."""
  monkeypatch.setenv("MPT_COST", "always")  # Measured here, whatever the run's length.
  monkeypatch.setenv("MPT_CACHE", str(tiny().logdir) + "-cache")
  run = train_run(tiny(policy="auto", epochs=1, loop="custom"))["run_dir"]
  summary = json.loads(open(f"{run}/summary.json").read())  # What tools read.
  choice, cost = summary["policy_choice"], summary["cost"]
  assert choice["requested"] == "auto" and cost["source"] == "measured"
  assert [r["policy"] for r in choice["candidates"]] == [
      "float32", "mixed_bfloat16", "mixed_float16"]
  # The choice's rows are the measurement's, not a second timing: the file holds
  # their times once, in `cost`, and the reader gives them to the choice.
  assert not any("ms_per_step" in r for r in choice["candidates"])
  measured = {r["policy"]: r["ms_per_step"] for r in cost["policies"]}
  choice = dataclasses.asdict(
      summary_lib.read(pathlib.Path(run) / "summary.json").policy_choice)
  rows = {r["policy"]: r for r in choice["candidates"]}
  assert {p: r["ms_per_step"] for p, r in rows.items()} == measured
  usable = {p: r["ms_per_step"] for p, r in rows.items()
            if r["ms_per_step"] is not None and r["finite"] and not r["dropped"]}
  assert choice["chosen"] == min(usable, key=usable.get)
  assert rows["float32"]["time_vs_float32"] == 1.0 and rows["float32"]["first_ms"] > 0
  # The run trained under the chosen policy: its flags, and its layers' dtypes.
  flags = open(f"{run}/flags.txt").read()
  assert f"--policy={choice['chosen']}\n" in flags and "--policy=auto" not in flags
  compute = config.POLICY_DTYPE[choice["chosen"]]
  assert (summary["policy"], summary["compute_dtype"]) == (choice["chosen"], compute)
  layers = json.loads(open(f"{run}/dtypes.json").read())["layers"]
  assert compute in {l["compute_dtype"] for l in layers}
  assert "precision/policy_choice" in read_events(run)


def _cost(**ms) -> Cost:
  """A measurement: {policy: ms} (None: not timed), "finite_POLICY"=False, and
  "predicted_POLICY"=True for a row the kernel table predicted."""
  rows = []
  for policy in config.POLICY_DTYPE:
    predicted = ms.get(f"predicted_{policy}", False)
    rows.append(PolicyCost(policy, ms_per_step=ms.get(policy), first_ms=ms.get(policy),
                           steps_timed=0 if predicted else 2, predicted=predicted,
                           finite=ms.get(f"finite_{policy}", True),
                           stopped="predicted from the kernel table" if predicted
                           else None))
  return Cost({}, True, 32, rows, seconds=3.0)


def test_the_fastest_finite_timed_policy_is_chosen_from_the_measurement():
  chosen, plan, choice = autopolicy.choose(_cost(
      float32=100.0, mixed_bfloat16=60.0, finite_mixed_bfloat16=False,
      mixed_float16=30.0, predicted_mixed_float16=True))
  # bfloat16 is faster but its loss was not finite; float16 was only predicted.
  assert (chosen, plan) == ("float32", "")
  rows = {r.policy: r for r in choice.candidates}
  assert rows["mixed_float16"].predicted_ms == 30.0
  assert math.isclose(rows["mixed_bfloat16"].time_vs_float32, 60 / 100)
  table = autopolicy.format_table(choice)
  assert "non-finite loss" in table and "predicted from the kernel table" in table
  assert choice.seconds == 3.0 and choice.steps_timed == 2
  guess = autopolicy.choose(None)
  assert guess[:2] == ("float32", "") and "a guess" in guess[2].note


def _plan(policy="mixed_bfloat16", **by_class) -> Plan:
  return Plan(policy, by_class or {"DepthwiseConv2D": "float32"}, 80.0, {})


@pytest.mark.parametrize("plan_ms, adopted", [(94.0, True), (95.0, True),
                                               (97.0, False)])
def test_a_plan_is_adopted_only_when_measured_5_percent_faster_side_by_side(
    plan_ms, adopted):
  """The per-layer costs' plan is timed beside the best uniform policy (its own row,
  timed again in the same measurement, 100 ms), not against the earlier 90 ms."""
  asked = []

  def time_plan(plan):
    asked.append(plan.layer_policy())
    return (PolicyCost("mixed_bfloat16", ms_per_step=plan_ms,
                       layer_policy=plan.layer_policy()),
            PolicyCost("mixed_bfloat16", ms_per_step=100.0))
  chosen, plan, choice = autopolicy.choose(
      _cost(float32=120.0, mixed_bfloat16=90.0, mixed_float16=400.0),
      lambda best: _plan(best), time_plan)
  assert asked == ["DepthwiseConv2D=float32"] and chosen == "mixed_bfloat16"
  assert plan == ("DepthwiseConv2D=float32" if adopted else "")
  assert choice.layer_policy == plan
  assert choice.note.startswith("adopted" if adopted else "not adopted (needs 5%)")
  rows = [(r.policy, r.layer_policy, r.ms_per_step) for r in choice.candidates[-2:]]
  assert rows == [("mixed_bfloat16", "", 100.0),
                  ("mixed_bfloat16", "DepthwiseConv2D=float32", plan_ms)]
  table = autopolicy.format_table(choice)
  assert "mixed_bfloat16 with DepthwiseConv2D=float32" in table


def test_the_plan_is_sought_over_the_policy_the_whole_step_measured_fastest():
  """The per-layer sums may rank the policies otherwise (ResNet50 at 64 px on a
  Sapphire Rapids: float32 by the sums, mixed_bfloat16 by the step): the plan starts
  from the step's best, and a plan that moves nothing is not timed."""
  asked = []
  never = lambda plan: pytest.fail("timed")
  cost = _cost(float32=100.0, mixed_bfloat16=120.0, mixed_float16=400.0)
  chosen, plan, choice = autopolicy.choose(
      cost, lambda best: asked.append(best) or Plan(best, {}, 99.0, {}), never)
  assert asked == ["float32"] and (chosen, plan) == ("float32", "")
  assert "predict no plan faster than --policy=float32" in choice.note


def test_auto_is_for_single_training_runs(tiny, tmp_path):
  with pytest.raises(UserError, match="--policy=auto is for single runs"):
    sweep.run(tiny(policy="auto"), SweepOptions())
  with pytest.raises(UserError, match="--policy=auto is for single runs"):
    sweep.run(tiny(), SweepOptions(policies="float32,auto"))
  from mpt.train.cli import dryrun
  with pytest.raises(UserError, match="use it with --mode=train"):
    dryrun.inspect_only(tiny(policy="auto"))


def test_float16_is_dropped_where_the_numerics_say_a_layer_would_overflow(tiny):
  """The model as built, sampled on the run's first batches: a layer whose outputs
  pass 65504 rules mixed_float16 out however fast it measured, and the table says
  which layer; the seed convnet rules nothing out."""
  from mpt.train.cli import data as data_lib
  from mpt.train.common import numerics as numerics_lib
  from mpt.train.common.model import build_model
  cfg = tiny()
  data = data_lib.load(cfg)
  model = boosted((16, 16, 3), 10)
  unsafe = numerics_lib.unsafe(cfg, model, data)
  assert list(unsafe) == ["mixed_float16"] and unsafe["mixed_float16"].startswith(
      "numerics: boost (")
  # The f16_overflow finding's rule (34a32f8): boost's reader is kept in float32 too,
  # or it would cast boost's float32 output to float16 (inf) on entry.
  assert "--layer_policy='boost|shrink=float32'" in unsafe["mixed_float16"]
  assert numerics_lib.unsafe(cfg, build_model(cfg, len(data.class_names)), data) == {}
  chosen, _, choice = autopolicy.choose(
      _cost(float32=100.0, mixed_bfloat16=80.0, mixed_float16=30.0), unsafe=unsafe)
  assert chosen == "mixed_bfloat16"
  rows = {r.policy: r for r in choice.candidates}
  assert rows["mixed_float16"].dropped == unsafe["mixed_float16"]
  assert "numerics: boost" in autopolicy.format_table(choice)
  # The advice, followed: mixed_float16 with those layers in float32 trains to the end.
  sys.modules.setdefault("auto_nets", sys.modules[__name__])
  pattern = re.search(r"--layer_policy='([^']+)'", unsafe["mixed_float16"]).group(1)
  followed = tiny(model="auto_nets:boosted", policy="mixed_float16",
                  layer_policy=pattern, epochs=1, checkpoint=False)
  assert train_run(followed)["status"] == "completed"


def boosted(input_shape, num_classes):
  """A convnet whose `boost` layer multiplies by 10^6 (its outputs pass 65504) and
  whose `shrink` layer, reading it, brings them back in range."""
  x = keras.Input(input_shape)
  h = keras.layers.Conv2D(4, 3, activation="relu", name="conv")(x)
  h = keras.layers.Rescaling(1e6, name="boost")(h)
  h = keras.layers.Rescaling(1e-6, name="shrink")(h)  # Reads boost; in range itself.
  h = keras.layers.GlobalAveragePooling2D(name="gap")(h)
  return keras.Model(x, keras.layers.Dense(num_classes, activation="softmax",
                                           dtype="float32")(h))


def test_an_adopted_plan_is_recorded_as_layer_policy_and_resume_keeps_it(
    tiny, tmp_path, monkeypatch):
  """docs/usage.md: --policy=auto records a plan it adopted as --layer_policy in
  flags.txt, so that --resume trains on under it. The evidence stands in: a recorded
  cost (mixed_bfloat16 fastest), per-layer costs where BatchNormalization is slower in
  bfloat16, and the side-by-side timing of that plan 20% faster than its policy."""
  from mpt.records import cost as cost_records
  from mpt.records.layers import Edge, LayerCosts, LayerRow
  from mpt.records.cost import PolicyCost as Row
  bf16 = "mixed_bfloat16"
  cost_records.write(tmp_path / "cost.json", _cost(
      float32=100.0, mixed_bfloat16=60.0, mixed_float16=90.0))
  rows = [LayerRow("Conv2D", ["conv1", "conv2", "conv3"], 3, [[16, 16, 3]],
                   {"float32": 20.0, bf16: 5.0, "mixed_float16": 90.0}),
          LayerRow("BatchNormalization", ["bn1", "bn2", "bn3"], 3, [[8, 8, 32]],
                   {"float32": 1.0, bf16: 4.0, "mixed_float16": 4.0})]
  casts = {f"{a}>{b}": [0.01, 0.0] for a in ("float32", "bfloat16", "float16")
           for b in ("float32", "bfloat16", "float16") if a != b}
  (tmp_path / "layers.json").write_text(json.dumps(LayerCosts(
      {"model": "seed_convnet"}, 32, rows,
      [Edge(f"conv{i}", f"bn{i}", 100) for i in (1, 2, 3)], casts).to_dict()))
  monkeypatch.setenv("MPT_COST", str(tmp_path / "cost.json"))
  monkeypatch.setenv("MPT_LAYERS", str(tmp_path / "layers.json"))
  monkeypatch.setattr(autopolicy, "time_plan", lambda cfg, build, plan: (
      Row(plan.policy, 48.0, 50.0, layer_policy=plan.layer_policy(), steps_timed=2),
      Row(plan.policy, 60.0, 62.0, steps_timed=2)))
  first = train_run(tiny(policy="auto", batchnorm="keras", epochs=1, checkpoint=True))
  plan = "BatchNormalization=float32"
  flags = (pathlib.Path(first["run_dir"]) / "flags.txt").read_text().split()
  assert f"--policy={bf16}" in flags and f"--layer_policy={plan}" in flags
  assert (first["policy"], first["layer_policy"]) == (bf16, plan)
  resumed = train_run(tiny(resume=first["run_dir"], epochs=2))
  assert (resumed["policy"], resumed["layer_policy"], resumed["resumed"]) == (
      bf16, plan, True)
