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
  current policy (building and tracing take no time), counting the calls per policy."""

  def __init__(self, script: dict[str, list[float]]):
    self.script = {p: iter(ms) for p, ms in script.items()}
    self.now, self.calls = 0.0, {}

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
            clock.now += next(clock.script[policy]) / 1e3
            return real(images, labels)

        self.train_step = Step()
    return Counted


def key(cfg) -> dict:
  return cost_lib.key_for(cfg, precision_onednn(), isa.detect())


def tiny_cfg(**changes) -> config.Config:
  return dataclasses.replace(config.Config(image_size=16, batch_size=32), **changes)


def build(cfg):
  return lambda: model.build_model(cfg, 10)


@pytest.mark.parametrize("calls,expect_ms,timed,stopped", [
    # The 16-bit policy's calls (first, second, timed ...) in ms; float32's are 40
    # (first), 20 (second), then 10 and 10 -> its ms/step, steps timed, why it stopped.
    ([60.0, 30.0, 20.0, 24.0], 22.0, 2, None),  # ~2x: timed fully, the median.
    ([60.0, 120.0], 60.0, 0, "second call > 5x"),  # As warm as float32 got: 120 / 2.
    ([230.0], 200.0, 0, "first call > 5x"),  # That call less float32's 30 ms overhead.
])
def test_each_policy_is_timed_float32_first_and_a_clearly_slow_one_is_cut_short(
    calls, expect_ms, timed, stopped, monkeypatch):
  """The real step of a tiny model runs; the scripted clock says how long each call
  took. A 16-bit policy clearly > 5x float32's is timed no further than it must."""
  clock = ScriptedCalls({"float32": [40.0, 20.0, 10.0, 10.0], "mixed_bfloat16": calls})
  monkeypatch.setattr(cost.steps_lib, "Steps", clock.counting(cost.steps_lib.Steps))
  cfg = tiny_cfg()
  found = cost.measure(cfg, build(cfg), ["float32", "mixed_bfloat16"], clock=clock)
  f32, bf16 = found.of("float32"), found.of("mixed_bfloat16")
  assert (f32.first_ms, f32.second_ms, f32.ms_per_step, f32.steps_timed) == (
      40.0, 20.0, 10.0, 2)
  assert bf16.ms_per_step == pytest.approx(expect_ms) and bf16.steps_timed == timed
  assert (bf16.stopped or "").startswith(stopped or "")
  assert bool(bf16.stopped) == bool(stopped)
  assert clock.calls["mixed_bfloat16"] == len(calls)  # No step ran that was not needed.
  assert found.batch == 32 and found.key["batch"] == 32
  assert found.key["model"] == "seed_convnet" and found.key["image_size"] == 16


def test_calls_after_the_first_ones_stop_at_the_budget(monkeypatch):
  """First calls (graph optimisation, whatever they take) aside, second calls and
  timed steps may take two of float32's steps and BUDGET_S more: here float32's 2 s
  steps leave 9 s; mixed_bfloat16's first call (90 s: far more than float32's, and
  still under STOP x float32's) and second call are made, its first timed step would
  pass the budget and is not: its second call is its estimate."""
  clock = ScriptedCalls({"float32": [40000.0, 2000.0, 2000.0, 2000.0],
                         "mixed_bfloat16": [90000.0, 3000.0, 3000.0, 3000.0]})
  monkeypatch.setattr(cost.steps_lib, "Steps", clock.counting(cost.steps_lib.Steps))
  cfg = tiny_cfg()
  found = cost.measure(cfg, build(cfg), ["float32", "mixed_bfloat16"], clock=clock)
  bf16 = found.of("mixed_bfloat16")
  assert cost.BUDGET_S == 5.0 and clock.calls == {"float32": 4, "mixed_bfloat16": 2}
  assert bf16.stopped.startswith("the budget before step 1")
  assert bf16.second_ms == 3000.0 and bf16.ms_per_step == pytest.approx(3000.0)


SPR_TABLE = DATA / "kernels" / "intel_spr_amx_recorded.json"


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_a_policy_the_kernel_table_marks_pathological_is_predicted_not_run(
    policy, monkeypatch):
  """The recorded Sapphire Rapids table puts float16's convolutions ~100x float32's:
  that policy's step is float32's by the table's ratio and never runs, unless it is
  the run's own policy (then it is timed, and stops after its slow first call)."""
  table = json.loads(SPR_TABLE.read_text())
  clock = ScriptedCalls({"float32": [40.0, 20.0, 10.0, 10.0],
                         "mixed_bfloat16": [30.0, 15.0, 5.0, 5.0],
                         "mixed_float16": [4000.0]})
  monkeypatch.setattr(cost.steps_lib, "Steps", clock.counting(cost.steps_lib.Steps))
  cfg = tiny_cfg(policy=policy)
  found = cost.measure(cfg, build(cfg), list(cost_lib.POLICIES), clock=clock,
                       table=lambda families: table)
  ratio = fastpath.policy_ratios(table, ["conv", "batchnorm", "matmul"])["mixed_float16"]
  assert ratio >= cost.PATHOLOGICAL  # What the recording says, checked here.
  f16 = found.of("mixed_float16")
  if policy == "float32":
    assert "mixed_float16" not in clock.calls
    assert f16.predicted and f16.ms_per_step == pytest.approx(10.0 * ratio, rel=1e-3)
    assert f16.stopped.startswith("predicted from the kernel table")
    assert "predicted from the kernel table" in cost_lib.one_line(found, "on")
  else:
    assert clock.calls["mixed_float16"] == 1 and not f16.predicted
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
    found = cost.measure(cfg, build(cfg), list(cost_lib.POLICIES), clock=clock)
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

  def fake_measure(cfg, build, policies, base=None, **_):
    calls.append(list(policies))
    return Cost(key(cfg), precision_onednn(), 32,
                [PolicyCost(p, ms_per_step=1.0 + i) for i, p in enumerate(policies)])

  monkeypatch.setattr(cost, "measure", fake_measure)
  cfg = tiny_cfg(model_opts="", image_size=17)  # A key no other test caches.
  found, note = cost.for_run(cfg, None, 10)
  assert found is None and "this run's 10 steps" in note and calls == []
  first, _ = cost.for_run(cfg, None, cost.MIN_RUN_STEPS)
  again, _ = cost.for_run(cfg, None, cost.MIN_RUN_STEPS)
  assert calls == [list(cost_lib.POLICIES)]  # Measured once ...
  assert first.source == "measured" and again.source.startswith("cache: ")
  assert again.predicted() == first.predicted()  # ... the same record read back.
  other, _ = cost.for_run(dataclasses.replace(cfg, batch_size=64), None, 100)
  assert len(calls) == 2 and other.key["batch"] == 64  # Another batch: another key.


def precision_onednn() -> bool:
  from mpt.train.common import keras_fit
  return keras_fit.onednn_rewrite_on()


def test_a_partial_cache_of_the_onednn_choice_is_completed_not_remeasured(monkeypatch):
  """The oneDNN choice's children measure float32 and the run's policy; the run then
  times only the policies still missing, and float32's row is passed on as the base
  of the 5x stop rule."""
  monkeypatch.delenv("MPT_COST")
  cfg = tiny_cfg(image_size=18)
  f32 = PolicyCost("float32", ms_per_step=50.0, first_ms=90.0, second_ms=60.0)
  cost_lib.save(Cost(key(cfg), precision_onednn(), 32,
                     [f32, PolicyCost("mixed_float16", ms_per_step=150.0)]))
  seen = {}

  def fake_measure(cfg, build, policies, base=None, **_):
    seen.update(policies=list(policies), base=base)
    return Cost(key(cfg), precision_onednn(), 32,
                [base, PolicyCost("mixed_bfloat16", ms_per_step=25.0)])

  monkeypatch.setattr(cost, "measure", fake_measure)
  found, _ = cost.for_run(cfg, None, 100)
  assert seen == {"policies": ["mixed_bfloat16"], "base": f32}
  assert found.predicted() == {"float32": 50.0, "mixed_bfloat16": 25.0,
                               "mixed_float16": 150.0}


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
  clock = ScriptedCalls({"float32": [40.0, 30.0, 20.0, 15.0, 10.0, 5.0, 10.0, 5.0]})
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
  monkeypatch.setattr(cost_lib, "POLICIES", ("float32",))
  cfg = tiny_cfg(jit_compile=True, image_size=19)  # A key no other test caches.
  found, _ = cost.for_run(cfg, build(dataclasses.replace(cfg)), 100)
  assert seen["plans"] == (("float32", "", False),) and jits == [True, False]
  with_xla, without = found.of("float32"), found.of("float32", "", False)
  # With XLA its calls took 40, 20, 10, 10; without: 30, 15, 5, 5.
  assert (with_xla.ms_per_step, without.ms_per_step) == (10.0, 5.0)
  assert found.predicted() == {"float32": 10.0}
  assert "float32 with XLA off ~5.0 (0.5x)" in cost_lib.one_line(found, "on")
