"""The step's cost per policy before step 1 (mpt/train/before_step1/cost.py, mpt/records/cost.py):
the timing rule on a scripted clock over a real tiny model's steps, the stand-in, the
cache and the skip, the line it prints, and the warning that follows it (fires exactly
from 2x). No timed assertion: every figure here comes from the scripted clock or a
recorded cost.json."""

import dataclasses
import json
import pathlib

import keras
import pytest

from mpt import config
from mpt.machine import fastpath
from mpt.machine import isa
from mpt.measure import policies
from mpt.records import cost as cost_lib
from mpt.records import summary as summary_lib
from mpt.records.cost import Cost, PolicyCost
from mpt.train.before_step1 import cost
from mpt.train.common import model
from mpt.train.common import precision
from mpt.train.before_step1 import preflight

from helpers import DATA, mpt_forked, tiny_flags

class ScriptedCalls:
  """A clock on which each call of the train step takes the next scripted ms of the
  current policy (its last repeats; building and tracing take no time), counting the
  calls per policy and logging their order."""

  def __init__(self, script: dict[str, list[float]]):
    self.script = {p: list(ms) for p, ms in script.items()}
    self.now, self.calls, self.order = 0.0, {}, []

  def __call__(self) -> float:
    return self.now

  def counting(self, steps_class):
    clock = self

    class Counted(steps_class):
      def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        policy = policies.resolved(self.model).name  # The candidate's.
        real = self.train_step

        class Step:  # The real tf.function, its calls counted and scripted.
          get_concrete_function = real.get_concrete_function

          def __call__(self, images, labels):
            clock.calls[policy] = clock.calls.get(policy, 0) + 1
            clock.order.append(policy)
            ms = clock.script[policy]
            clock.now += (ms.pop(0) if len(ms) > 1 else ms[0]) / 1e3
            return real(images, labels)

        self.train_step = Step()
    return Counted


def key(cfg) -> dict:
  return cost_lib.key_for(cfg, precision_onednn(), isa.detect())


def tiny_cfg(**changes) -> config.Config:
  return dataclasses.replace(config.Config(image_size=16, batch_size=32), **changes)


def build(cfg):
  return lambda: model.build_model(cfg, 10)


@pytest.mark.parametrize("calls,expect_ms,timed,bound", [
    # The 16-bit policy's calls (first, then the rest) in ms; float32's are 40 (first),
    # 20, then 10s -> its ms/step, the calls timed after its first, its bound.
    ([60.0, 30.0, 22.0, 21.0, 22.0], 22.0, 4, None),  # Settled: its last 3 agree.
    # Two calls fit the budget (2 of float32's steps + 5 s), a third would not: still
    # falling, so its step is at most its last call, not an estimate.
    ([3000.0, 2500.0, 2000.0], 2000.0, 2, "at most"),
    # Its second call, float32's scaled by their first calls (~45 s), would pass the
    # budget: at most its first call.
    ([90000.0], 90000.0, 0, "at most"),
])
def test_each_policy_is_timed_until_it_settles_and_a_slow_one_stops_as_a_bound(
    calls, expect_ms, timed, bound, monkeypatch):
  """The real step of a tiny model runs; the scripted clock says how long each call
  took. Interleaved: float32's first two calls, the other's first, then one call
  each a round."""
  clock = ScriptedCalls({"float32": [40.0, 20.0, 10.0, 10.0, 10.0],
                         "mixed_bfloat16": calls})
  monkeypatch.setattr(cost.steps_lib, "Steps", clock.counting(cost.steps_lib.Steps))
  cfg, builds = tiny_cfg(), []
  found = cost.measure(cfg, lambda: builds.append(1) or build(cfg)(),
                       ["float32", "mixed_bfloat16"], clock=clock)
  assert builds == [1]  # One model, built once, every candidate traced over it.
  f32, bf16 = found.of("float32"), found.of("mixed_bfloat16")
  assert (f32.first_ms, f32.ms_per_step, f32.steps_timed, f32.bound) == (
      40.0, 10.0, 4, None)
  assert bf16.ms_per_step == expect_ms and bf16.steps_timed == timed
  assert bf16.bound == bound and bool(bf16.stopped) == bool(bound)
  assert clock.calls["mixed_bfloat16"] == timed + 1  # No call that was not needed.
  assert clock.order[:4] == ["float32"] * 2 + ["mixed_bfloat16", "float32"]
  assert found.batch == 32 and found.key["batch"] == 32
  assert found.key["model"] == "seed_convnet" and found.key["image_size"] == 16
  if bound:
    assert found.predicted() == {"float32": 10.0}  # A bound is not a figure ...
    assert found.bounds() == {"mixed_bfloat16": ("at most", expect_ms / 10.0)}
    assert f"mixed_bfloat16 at most ~{expect_ms:,.0f} (at most " in cost_lib.one_line(
        found, "on")


def test_the_run_policy_is_timed_right_after_float32_and_the_budget_is_float32s(
    monkeypatch):
  """After the first calls, calls may take two of float32's steps and BUDGET_S more
  (float32's 200 ms steps leave 5.4 s): mixed_float16's second call (3 s) fits, a
  third would not; the run's own policy is made and timed before the other."""
  clock = ScriptedCalls({"float32": [400.0, 200.0, 200.0, 200.0],
                         "mixed_bfloat16": [300.0, 100.0, 100.0, 100.0],
                         "mixed_float16": [500.0, 3000.0]})
  monkeypatch.setattr(cost.steps_lib, "Steps", clock.counting(cost.steps_lib.Steps))
  cfg = tiny_cfg(policy="mixed_float16")
  found = cost.measure(cfg, build(cfg), list(config.POLICY_DTYPE), clock=clock)
  assert cost.BUDGET_S == 5.0 and clock.order[:4] == [
      "float32", "float32", "mixed_float16", "mixed_bfloat16"]
  f16 = found.of("mixed_float16")
  assert clock.calls["mixed_float16"] == 2 and (f16.bound, f16.ms_per_step) == (
      "at most", 3000.0)
  assert f16.stopped.startswith("timing stopped: the budget (2 of float32's steps")
  assert found.of("mixed_bfloat16").ms_per_step == 100.0  # Settled meanwhile.


def test_measuring_takes_at_most_its_share_of_the_planned_training(monkeypatch):
  """A run planning 40 steps: 10% of 40 of float32's steps, as its second call put it
  (20 ms), is 80 ms; float32's first two calls took 60 and mixed_bfloat16's trace and
  first call would take about as long as float32's (40): it is not made at all, and
  says why."""
  clock = ScriptedCalls({"float32": [40.0, 20.0, 10.0, 10.0, 10.0],
                         "mixed_bfloat16": [30.0, 15.0, 5.0, 5.0]})
  monkeypatch.setattr(cost.steps_lib, "Steps", clock.counting(cost.steps_lib.Steps))
  cfg = tiny_cfg()
  found = cost.measure(cfg, build(cfg), ["float32", "mixed_bfloat16"], clock=clock,
                       planned_steps=40)
  bf16 = found.of("mixed_bfloat16")
  assert "mixed_bfloat16" not in clock.calls and bf16.ms_per_step is None
  assert bf16.stopped == ("not timed: 10% of the run's planned training (40 steps of "
                          "~10 ms: 0.04 s) was spent; a run of more steps times it")
  assert found.of("float32").ms_per_step == 10.0
  # Nothing more to time for a run as short; a longer one times it.
  assert (bf16.known_for(40), bf16.known_for(400), bf16.known_for(None)) == (
      True, False, False)


SPR_TABLE = DATA / "kernels" / "intel_spr_amx_recorded.json"


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_a_policy_the_kernel_table_marks_pathological_is_predicted_not_run(
    policy, monkeypatch):
  """The recorded Sapphire Rapids table puts float16's convolutions ~100x float32's:
  that policy's step is float32's by the table's ratio and never runs, unless it is
  the run's own policy (then it is timed, and stops at the budget as a bound)."""
  table = json.loads(SPR_TABLE.read_text())
  clock = ScriptedCalls({"float32": [40.0, 20.0, 10.0, 10.0],
                         "mixed_bfloat16": [30.0, 15.0, 5.0, 5.0],
                         "mixed_float16": [4000.0]})
  monkeypatch.setattr(cost.steps_lib, "Steps", clock.counting(cost.steps_lib.Steps))
  cfg = tiny_cfg(policy=policy)
  found = cost.measure(cfg, build(cfg), list(config.POLICY_DTYPE), clock=clock,
                       table=lambda families: table)
  ratio = fastpath.policy_ratios(table, ["conv", "batchnorm", "matmul"])["mixed_float16"]
  assert ratio >= fastpath.PATHOLOGICAL  # What the recording says, checked here.
  f16 = found.of("mixed_float16")
  if policy == "float32":
    assert "mixed_float16" not in clock.calls
    assert f16.predicted and f16.ms_per_step == pytest.approx(10.0 * ratio, rel=1e-3)
    assert f16.stopped.startswith("predicted from the kernel table")
    assert "predicted from the kernel table" in cost_lib.one_line(found, "on")
  else:
    assert clock.calls["mixed_float16"] == 2 and not f16.predicted
    assert (f16.bound, f16.ms_per_step) == ("at most", 4000.0)
  assert found.of("mixed_bfloat16").ms_per_step == 5.0 and not found.of(
      "mixed_bfloat16").predicted


def test_a_fresh_machine_learns_a_pathological_kernel_from_one_call_not_a_step(
    tmp_path, monkeypatch):
  """No kernel table cached and none standing in: the model's weight-gradient
  kernels are timed in-process (here: Sapphire Rapids' recorded times for them), so
  mixed_float16's step is predicted and never run; with MPT_KERNELS=none (nothing
  measured, by request) nothing is timed and the step runs."""
  recorded = json.loads(SPR_TABLE.read_text())["rows"]
  asked = []

  def spr_kernels(families):
    asked.append(sorted(families))
    ops = {"Conv2DBackpropFilter", "MatMul/grad_weights"}
    return {"rows": [r for r in recorded if r["op"] in ops]}

  monkeypatch.setattr(cost.gradkernels, "table", spr_kernels)
  monkeypatch.setenv("MPT_CACHE", str(tmp_path))  # No table cached.
  monkeypatch.delenv("MPT_KERNELS")
  cfg, steps_class = tiny_cfg(), cost.steps_lib.Steps
  for stand_in, runs in ((None, False), ("none", True)):
    if stand_in:
      monkeypatch.setenv("MPT_KERNELS", stand_in)
    clock = ScriptedCalls({"float32": [40.0, 20.0, 10.0, 10.0],
                           "mixed_bfloat16": [30.0, 15.0, 5.0, 5.0],
                           "mixed_float16": [4000.0, 900.0]})
    monkeypatch.setattr(cost.steps_lib, "Steps", clock.counting(steps_class))
    found = cost.measure(cfg, build(cfg), list(config.POLICY_DTYPE), clock=clock)
    assert ("mixed_float16" in clock.calls) == runs
    assert found.of("mixed_float16").predicted == (not runs)
  assert asked == [["batchnorm", "conv", "matmul"]]  # The model's families, once.


def test_a_per_layer_plan_is_timed_as_a_row_of_its_own(monkeypatch):
  """--layer_policy's plan over a policy is built with its layers moved and the loss
  scaled where one of them computes in float16, beside the uniform rows."""
  built = []
  clock = ScriptedCalls({"float32": [40.0, 20.0, 10.0, 10.0],
                         "mixed_bfloat16": [30.0, 15.0, 8.0, 8.0]})
  counted = clock.counting(cost.steps_lib.Steps)

  class Seen(counted):
    def __init__(self, model, optimizer, **kwargs):
      built.append(({l.name: l.dtype_policy.name for l in model.layers}, optimizer))
      super().__init__(model, optimizer, **kwargs)

  monkeypatch.setattr(cost.steps_lib, "Steps", Seen)
  cfg = tiny_cfg()
  found = cost.measure(cfg, build(cfg), ["float32"], clock=clock,
                       plans=(("mixed_bfloat16", "logits=mixed_float16"),))
  plan = found.of("mixed_bfloat16", "logits=mixed_float16")
  assert plan.ms_per_step == 8.0 and found.of("float32").ms_per_step == 10.0
  assert found.plans() == [plan] and found.predicted() == {"float32": 10.0}
  assert found.of("mixed_bfloat16") is None  # Only the plan was asked for.
  (uniform, opt1), (moved, opt2) = built
  assert set(uniform.values()) == {"float32"}
  assert moved["logits"] == "mixed_float16" and moved["conv1"] == "mixed_bfloat16"
  assert not isinstance(opt1, keras.optimizers.LossScaleOptimizer)
  assert isinstance(opt2, keras.optimizers.LossScaleOptimizer)


def recorded(tmp_path, ms: dict[str, float], **changes) -> pathlib.Path:
  found = Cost(key={}, onednn=True, batch=32, policies=[
      PolicyCost(p, ms_per_step=v) for p, v in ms.items()], **changes)
  path = tmp_path / "cost.json"
  cost_lib.write(path, found)
  return path


def test_a_recorded_cost_stands_in_and_none_measures_nothing(tmp_path, monkeypatch):
  monkeypatch.setattr(cost, "measure", lambda *a, **k: pytest.fail("measured"))
  path = recorded(tmp_path, {"float32": 200.0, "mixed_float16": 740.0})
  monkeypatch.setenv("MPT_COST", str(path))
  found, note = cost.for_run(tiny_cfg(), None, 1000)
  assert note is None and found.source == f"recorded: {path}"
  assert found.ratios()["mixed_float16"] == pytest.approx(3.7)
  monkeypatch.setenv("MPT_COST", "none")
  assert cost.for_run(tiny_cfg(), None, 1000) == (None, None)
  monkeypatch.setenv("MPT_COST", str(tmp_path / "missing.json"))
  found, note = cost.for_run(tiny_cfg(), None, 1000)
  assert found is None and "cannot be read" in note


def test_measured_once_then_read_from_the_cache_and_short_runs_skip_it(monkeypatch):
  monkeypatch.delenv("MPT_COST")
  calls = []

  def fake_measure(cfg, build, policies, **_):
    calls.append(list(policies))
    return Cost(key(cfg), precision_onednn(), 32,
                [PolicyCost(p, ms_per_step=1.0 + i) for i, p in enumerate(policies)])

  monkeypatch.setattr(cost, "measure", fake_measure)
  cfg = tiny_cfg(model_opts="", image_size=17)  # A key no other test caches.
  found, note = cost.for_run(cfg, None, 10)
  assert found is None and "this run's 10 steps" in note and calls == []
  first, _ = cost.for_run(cfg, None, cost.MIN_RUN_STEPS)
  again, _ = cost.for_run(cfg, None, cost.MIN_RUN_STEPS)
  assert calls == [list(config.POLICY_DTYPE)]  # Measured once ...
  assert first.source == "measured" and again.source.startswith("cache: ")
  assert again.predicted() == first.predicted()  # ... the same record read back.
  other, _ = cost.for_run(dataclasses.replace(cfg, batch_size=64), None, 100)
  assert len(calls) == 2 and other.key["batch"] == 64  # Another batch: another key.


def precision_onednn() -> bool:
  from mpt.train.common import keras_fit
  return keras_fit.onednn_rewrite_on()


def test_a_partial_cache_of_the_onednn_choice_is_completed_not_remeasured(monkeypatch):
  """The oneDNN choice's child measured float32 and the run's policy; the run then
  times the policies still missing beside float32 (the baseline is always timed), and
  the cached row keeps its ratio to its own float32 over the fresh one."""
  monkeypatch.delenv("MPT_COST")
  cfg = tiny_cfg(image_size=18)
  cost_lib.save(Cost(key(cfg), precision_onednn(), 32,
                     [PolicyCost("float32", ms_per_step=50.0),
                      PolicyCost("mixed_float16", ms_per_step=150.0)]))
  seen = {}

  def fake_measure(cfg, build, policies, **kwargs):
    seen.update(policies=list(policies))
    return Cost(key(cfg), precision_onednn(), 32,
                [PolicyCost("float32", ms_per_step=40.0),
                 PolicyCost("mixed_bfloat16", ms_per_step=25.0)])

  monkeypatch.setattr(cost, "measure", fake_measure)
  found, _ = cost.for_run(cfg, None, 100)
  assert seen == {"policies": ["mixed_bfloat16"]}
  assert found.predicted() == {"float32": 40.0, "mixed_bfloat16": 25.0,
                               "mixed_float16": 120.0}


def test_the_line_before_step_1(tmp_path):
  found = cost_lib.read(recorded(tmp_path, {"float32": 200.0, "mixed_bfloat16": 2400.0,
                                            "mixed_float16": 740.0}))
  found.source, found.seconds = "measured", 6.1
  line = cost_lib.one_line(found, "off (TF's default)")
  assert line == ("mpt: cost here, oneDNN's rewrite off (TF's default), measured in 6.1 s "
                  "at batch 32: "
                  "float32 ~200 ms/step, mixed_bfloat16 ~2,400 (12x), "
                  "mixed_float16 ~740 (3.7x)")


@pytest.mark.parametrize("f16_ms,warned", [(399.0, False), (400.0, True)])
def test_the_warning_fires_exactly_from_2x_the_measured_step(f16_ms, warned, tmp_path,
                                                             monkeypatch, capsys):
  """The step's measurement outranks the kernel table (the session's stand-in is the
  Sapphire Rapids table, which says ~100x for float16's convolutions): 1.995x is not
  warned about, 2.0x is, naming the measured step times."""
  found = cost_lib.read(recorded(tmp_path, {"float32": 200.0, "mixed_bfloat16": 100.0,
                                            "mixed_float16": f16_ms}))
  verdict = precision.check_speed("mixed_float16", ["Conv2D", "Dense"], found)
  out = capsys.readouterr().out
  assert verdict.evidence == "cost" and verdict.slow is warned
  assert ("WARNING" in out) is warned
  if warned:
    assert "this model's step measured 2x float32's time here (~400 vs ~200 " \
           "ms/step)" in out and "--policy=mixed_bfloat16" in out
    assert "Conv2DBackpropFilter" in out  # The kernel table still names the op.


@pytest.mark.parametrize("bound,ratio,slow,fastest", [
    ("at least", 3.0, True, "float32"),  # Decides it slow: warned, as a bound.
    ("at most", 8.0, False, "float32"),  # Decides nothing: a note, no warning.
    ("at most", 0.5, False, "mixed_bfloat16"),  # Faster than float32 whatever it is.
])
def test_a_bound_decides_the_verdict_only_where_it_decides_it(bound, ratio, slow,
                                                              fastest):
  found = fastpath.verdict("mixed_bfloat16", None, ["conv"], set(), [], "x",
                           {"float32": 100.0, "mixed_float16": 300.0},
                           (bound, ratio))
  assert (found.evidence, found.slow, found.bound, found.fastest) == (
      "cost", slow, bound, fastest)
  said = found.text if slow else found.note
  assert f"measured {bound} {cost_lib.times(ratio)} float32's time here" in said
  assert ("undecided" in said) is (not slow and fastest == "float32")
  assert "mixed_bfloat16" not in found.policy_ratios  # A bound is no ratio to compare.


def test_without_a_step_measurement_the_kernel_table_decides():
  table = json.loads((DATA / "kernels" / "intel_spr_amx_recorded.json").read_text())
  found = fastpath.verdict("mixed_float16", table, ["conv"], set(), [], "x",
                           {"float32": 100.0})  # float32 alone: nothing to compare.
  assert found.evidence == "probe" and found.slow


def test_the_users_command_on_a_recorded_cost_prints_warns_records_and_replays(
    tmp_path):
  """`--policy=mixed_float16` with a cost.json standing in for the measurement (the
  figures the issue measured on a Zen 3: float32 200, float16 740, bfloat16 2,400
  ms/step): the line before step 1, the warning from the step's ratio, summary.json,
  and flags.txt recording the oneDNN state the run trained with."""
  path = recorded(tmp_path, {"float32": 200.0, "mixed_bfloat16": 2400.0,
                             "mixed_float16": 740.0})
  proc = mpt_forked(*tiny_flags(tmp_path, "--epochs=1", "--policy=mixed_float16"),
                    env={"MPT_COST": str(path)})
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.splitlines()
  assert any(l.startswith("mpt: cost here, oneDNN's rewrite ") and l.endswith(
      f"recorded: {path}: float32 ~200 ms/step, mixed_bfloat16 ~2,400 (12x), "
      "mixed_float16 ~740 (3.7x)") for l in lines), proc.stdout
  [warning] = [l for l in lines if l.startswith("WARNING: mixed_float16")]
  assert "3.7x float32's time here (~740 vs ~200 ms/step)" in warning
  assert "--policy=float32" in warning
  run = next(p for p in (tmp_path / "logs").iterdir() if p.is_dir())
  summary = json.loads((run / "summary.json").read_text())
  assert summary["policy_verdict"]["evidence"] == "cost"
  assert summary["cost"]["source"] == f"recorded: {path}"
  state = "on" if summary["onednn_choice"]["on"] else "off"
  assert f"--onednn={state}" in (run / "flags.txt").read_text().split()


def test_auto_reads_the_one_measurement_and_times_nothing_more(tmp_path):
  path = recorded(tmp_path, {"float32": 200.0, "mixed_bfloat16": 2400.0,
                             "mixed_float16": 740.0})
  proc = mpt_forked(*tiny_flags(tmp_path, "--epochs=1", "--policy=auto"),
                    env={"MPT_COST": str(path)})
  assert proc.returncode == 0, proc.stderr[-3000:]
  run = next(p for p in (tmp_path / "logs").iterdir() if p.is_dir())
  summary = json.loads((run / "summary.json").read_text())
  assert summary["policy"] == "float32"
  choice = dataclasses.asdict(summary_lib.read(run / "summary.json").policy_choice)
  assert [(c["policy"], c["ms_per_step"]) for c in choice["candidates"]] == [
      ("float32", 200.0), ("mixed_bfloat16", 2400.0), ("mixed_float16", 740.0)]
  assert choice["steps_timed"] == 0 and choice["layer_policy"] == ""
  assert choice["note"] == "no per-layer cost here: no plan considered"
  assert "mpt: --policy=auto: float32 was fastest here" in proc.stdout


def test_a_step_that_would_not_fit_in_memory_is_not_measured(monkeypatch):
  """Measuring runs the step at the run's batch before the memory preflight refuses
  the run: where the preflight's estimate says it will not fit, nothing is timed."""
  monkeypatch.delenv("MPT_COST")
  monkeypatch.setattr(cost, "measure", lambda *a, **k: pytest.fail("measured"))
  cfg = tiny_cfg(image_size=19)
  monkeypatch.setenv("MPT_AVAILABLE_MB", "1")
  reason = preflight.will_not_fit(cfg, build(cfg))
  assert reason.startswith("memory: batch 32 under float32 needs ~")
  found, note = cost.for_run(cfg, None, 100, fits=lambda: reason)
  assert found is None and note.endswith(reason)
  monkeypatch.setenv("MPT_AVAILABLE_MB", "100000")
  assert preflight.will_not_fit(cfg, build(cfg)) is None


def test_a_run_with_xla_also_times_its_step_without_it(monkeypatch):
  """--jit_compile: the run's policy is also timed with XLA off, a row of its own
  (XLA was measured 12-29x slower on a CPU); the uniform rows keep the run's XLA."""
  jits = []
  # Both rows are float32's: one script, in the interleaved order of their calls.
  clock = ScriptedCalls({"float32": [40.0, 20.0, 30.0, 10.0, 5.0, 10.0, 5.0, 10.0,
                                     5.0]})
  counted = clock.counting(cost.steps_lib.Steps)

  class Seen(counted):
    def __init__(self, model, optimizer, **kwargs):
      jits.append(kwargs["jit_compile"])
      super().__init__(model, optimizer, **kwargs)

  monkeypatch.setattr(cost.steps_lib, "Steps", Seen)
  seen = {}
  real = cost.measure

  def measure(cfg, build, policies, **kwargs):
    seen.update(policies=list(policies), plans=kwargs.get("plans"))
    return real(cfg, build, policies, clock=clock, **kwargs)

  monkeypatch.setattr(cost, "measure", measure)
  monkeypatch.delenv("MPT_COST")
  monkeypatch.setattr(config, "POLICY_DTYPE", {"float32": "float32"})
  cfg = tiny_cfg(jit_compile=True, image_size=19)  # A key no other test caches.
  # A run long enough that its share of the training lets every call through.
  found, _ = cost.for_run(cfg, build(dataclasses.replace(cfg)), 10_000)
  assert seen["plans"] == (("float32", "", False),) and jits == [True, False]
  with_xla, without = found.of("float32"), found.of("float32", "", False)
  # With XLA its calls took 40, 20 (before the other's first), 10, 10, 10; without:
  # 30, 5, 5, 5.
  assert (with_xla.ms_per_step, without.ms_per_step) == (10.0, 5.0)
  assert found.predicted() == {"float32": 10.0}
  assert "float32 with XLA off ~5.0 (0.5x)" in cost_lib.one_line(found, "on")


def _cost(rows: dict, **row_changes) -> Cost:
  return Cost({"model": "checked"}, True, 32, [
      PolicyCost(p, ms_per_step=v, spread=0.02, **row_changes.get(p, {}))
      for p, v in rows.items()])


def test_the_runs_own_steps_check_its_policys_row_and_replace_the_cache_entry(
    monkeypatch, tmp_path):
  """Within the row's spread (at least the timer's 10%): the record as it was. Beyond
  it, a settled row scales every row alike (the ratios were timed side by side), a
  bound takes the run's figure alone; the cache holds the checked record."""
  monkeypatch.setenv("MPT_CACHE", str(tmp_path))
  ms = {"float32": 100.0, "mixed_bfloat16": 50.0, "mixed_float16": 300.0}
  agreed = _cost(ms)
  assert cost.checked_by_run(agreed, "float32", "", 109.0, 20, "run") is agreed
  fixed = cost.checked_by_run(_cost(ms), "float32", "", 120.0, 20, "run")
  assert fixed.predicted() == {"float32": 120.0, "mixed_bfloat16": 60.0,
                               "mixed_float16": 360.0}
  assert fixed.of("float32").from_run == ("run: its own 20 steps measured 120.0 ms/step; "
                                          "timed before step 1: 100.0 ms, every row "
                                          "scaled alike")
  assert (fixed.of("float32").timed_ms, fixed.of("mixed_bfloat16").timed_ms) == (
      100.0, 50.0)
  assert cost_lib.cached({"model": "checked"}).predicted() == fixed.predicted()
  bounded = _cost(ms, mixed_bfloat16={"bound": "at most", "stopped": "timing stopped"})
  fixed = cost.checked_by_run(bounded, "mixed_bfloat16", "", 70.0, 20, "run")
  assert fixed.predicted() == {**ms, "mixed_bfloat16": 70.0} and not fixed.bounds()
  assert "timed before step 1: at most 50.0 ms" in fixed.of("mixed_bfloat16").from_run
