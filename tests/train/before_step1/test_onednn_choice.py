"""TF's oneDNN rewrite for a run (mpt/train/before_step1/onednn_choice.py): forced, from the
environment, TF's default, or measured per setting in children before TensorFlow
starts; read back by the training process and recorded. The measuring is a stand-in
(scripted costs) except in one test, whose child really runs with the variable set."""

import os

import pytest

from mpt import config
from mpt.machine import isa
from mpt.records import cost as cost_lib
from mpt.records.cost import Cost, PolicyCost
from mpt.train.before_step1 import onednn_choice

import helpers

ZEN3 = str(helpers.CPUINFO / "amd_epyc_zen3_dev_machine.txt")
SPR = str(helpers.CPUINFO / "intel_spr_amx_recorded.txt")


@pytest.fixture
def zen3(monkeypatch, tmp_path):
  """A CPU where TF leaves the rewrite off, nothing set, the measurement allowed, an
  empty cache (a choice is cached per machine and model)."""
  monkeypatch.setenv("MPT_CACHE", str(tmp_path / "cache"))
  monkeypatch.setenv("MPT_CPUINFO", ZEN3)
  monkeypatch.delenv("MPT_COST")
  monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)


def scripted(ms: dict[bool, float | None], calls: list | None = None):
  """A measure() whose float32 step takes ms[setting] (None: the child failed)."""
  def measure(cfg, on, policies):
    if calls is not None:
      calls.append((on, list(policies)))
    if ms[on] is None:
      return None, "the child died"
    return Cost({}, on, 32, [PolicyCost(p, ms_per_step=ms[on]) for p in policies]), ""
  return measure


def test_where_tf_leaves_it_off_both_settings_are_measured_and_the_faster_kept(zen3):
  calls = []
  choice = onednn_choice.choose(config.Config(), scripted({True: 150.0, False: 200.0},
                                                          calls))
  # Off: what the run's choice needs; on (the likely winner): every policy, so that
  # the run finds its whole cost in the cache.
  assert calls == [(False, ["float32"]), (True, list(config.POLICY_DTYPE))]
  assert (choice.on, choice.env, choice.tf_default, choice.chosen_by) == (
      True, "1", False, "measured")
  assert choice.measured_ms == {"on": 150.0, "off": 200.0}
  assert "~150 ms with it, ~200 without (1.33x; measured in " in choice.why
  assert "TF leaves it off on CPUs without AVX512_VNNI" in choice.why


def test_the_choice_is_measured_once_per_machine_and_model(zen3):
  """A second run of the model (another batch, another length) reads the choice its
  first measured: nothing measured again, the line says where it came from."""
  calls = []
  first = onednn_choice.choose(config.Config(), scripted({True: 150.0, False: 200.0},
                                                         calls))
  again = onednn_choice.choose(config.Config(batch_size=64, epochs=9),
                               scripted({True: 1.0, False: 1.0}, calls))
  assert len(calls) == 2 and (again.on, again.measured_ms) == (True, first.measured_ms)
  assert again.source.startswith("cache: ") and "measured once per machine and model" \
      in again.why
  other = onednn_choice.choose(config.Config(model="resnet"),
                               scripted({True: 1.0, False: 1.0}, calls))
  assert len(calls) == 4 and other.source == "measured"


def test_a_difference_within_the_margin_keeps_tfs_default(zen3):
  choice = onednn_choice.choose(config.Config(policy="mixed_float16"),
                                scripted({True: 196.0, False: 200.0}))
  assert (choice.on, choice.env, choice.chosen_by) == (False, None, "measured")
  assert "TF's default (off) kept" in choice.why


@pytest.mark.parametrize("on_ms,switched", [
    (190.0, False),  # Exactly 5% less than off's 200 ms: not enough.
    (189.9, True),  # 5.05% less: more than the margin.
])
def test_the_margin_is_five_percent_of_the_off_time_exclusive(zen3, on_ms, switched):
  """The edges of docs/usage.md's 5% margin: a changed margin, or `<=` for `<`,
  fails one of them."""
  choice = onednn_choice.choose(config.Config(), scripted({True: on_ms, False: 200.0}))
  assert (choice.on, choice.env) == ((True, "1") if switched else (False, None))
  assert choice.chosen_by == "measured"


def test_the_run_policy_and_float32_are_measured_and_the_run_policy_decides(zen3):
  calls = []
  onednn_choice.choose(config.Config(policy="mixed_bfloat16"),
                       scripted({True: 10.0, False: 20.0}, calls))
  assert calls[0] == (False, ["float32", "mixed_bfloat16"])


def test_a_failed_measurement_keeps_tfs_default_and_says_why(zen3):
  choice = onednn_choice.choose(config.Config(), scripted({True: None, False: 200.0}))
  assert (choice.on, choice.env, choice.chosen_by) == (False, None, "TF's default")
  assert "measuring failed (on: the child died)" in choice.why


@pytest.mark.parametrize("changes,why", [
    ({"epochs": 1, "steps_per_epoch": 5}, "this run's 5 steps"),
    ({"strategy": "multi_worker"}, "each worker of a cluster"),
])
def test_nothing_is_measured_where_it_cannot_pay(zen3, changes, why):
  choice = onednn_choice.choose(config.Config(**changes),
                                scripted({True: 1.0, False: 2.0}, calls := []))
  assert calls == [] and why in choice.why and choice.on is False


@pytest.mark.parametrize("visible,device,smi,expect", [
    (None, True, False, True),  # The driver's device file alone.
    (None, False, True, True),  # nvidia-smi alone.
    ("0", True, True, True),
    (None, False, False, False),  # No driver.
    ("", True, True, False),  # Hidden, as this session does (conftest.py).
    ("-1", True, True, False),
])
def test_a_gpu_is_visible_where_a_driver_is_and_cuda_does_not_hide_it(
    monkeypatch, visible, device, smi, expect):
  """_gpu_visible on a stand-in host: its driver's files, CUDA_VISIBLE_DEVICES."""
  if visible is None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  else:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
  exists = os.path.exists
  monkeypatch.setattr(onednn_choice.os.path, "exists",
                      lambda p: device if p == "/dev/nvidia0" else exists(p))
  monkeypatch.setattr(onednn_choice.shutil, "which",
                      lambda name: "/usr/bin/nvidia-smi" if smi and name == "nvidia-smi"
                      else None)
  assert onednn_choice._gpu_visible() is expect


def test_nothing_is_measured_where_the_step_runs_on_a_gpu(zen3, monkeypatch):
  monkeypatch.setattr(onednn_choice, "_gpu_visible", lambda: True)
  choice = onednn_choice.choose(config.Config(), scripted({True: 1.0, False: 2.0},
                                                          calls := []))
  assert calls == [] and "the step runs on a GPU" in choice.why


def test_forced_set_or_default_on_needs_no_measurement(zen3, monkeypatch):
  never = scripted({True: 1.0, False: 1.0}, calls := [])
  forced = onednn_choice.choose(config.Config(onednn="off"), never)
  assert (forced.on, forced.env, forced.chosen_by) == (False, "0", "--onednn")
  monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "true")
  env = onednn_choice.choose(config.Config(), never)
  assert (env.on, env.env, env.chosen_by) == (True, "true", "environment")
  monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS")
  monkeypatch.setenv("MPT_CPUINFO", SPR)  # AMX: TF turns it on itself.
  default = onednn_choice.choose(config.Config(), never)
  assert (default.on, default.env, default.chosen_by) == (True, None, "TF's default")
  assert "TF turns it on for CPUs with AVX512_VNNI" in default.why
  assert calls == []


def test_the_training_process_reads_the_choice_and_tfs_answer_wins(zen3, monkeypatch):
  env = onednn_choice.for_child(config.Config(onednn="on"))
  try:
    assert env["TF_ENABLE_ONEDNN_OPTS"] == "1"
    monkeypatch.setenv("MPT_ONEDNN_CHOICE", env["MPT_ONEDNN_CHOICE"])
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "1")
    choice = onednn_choice.current(True)
    assert (choice.on, choice.env, choice.chosen_by) == (True, "1", "--onednn")
    off = onednn_choice.current(False)  # A TF built without oneDNN, say.
    assert off.on is False and "(TF reports the rewrite off)" in off.why
  finally:
    onednn_choice.forget(env)
  assert not os.path.exists(env["MPT_ONEDNN_CHOICE"])


def test_a_resumed_run_keeps_the_setting_its_flags_recorded(zen3, tmp_path):
  (tmp_path / "flags.txt").write_text(config.to_flagfile(config.Config(onednn="off")))
  env = onednn_choice.for_child(config.Config(resume=str(tmp_path)))
  onednn_choice.forget(env)
  assert env["TF_ENABLE_ONEDNN_OPTS"] == "0"


@pytest.mark.parametrize("on", [False, True])
def test_the_measuring_child_runs_under_the_setting_it_was_given(zen3, tmp_path,
                                                                 monkeypatch, on):
  """A real child per setting (`python -m mpt.train.before_step1.cost`), a tiny model: the cost it
  writes says the rewrite was as set, whatever this host's default (so both settings:
  a child that ignored the setting passes one of them on any host)."""
  monkeypatch.setenv("MPT_CACHE", str(tmp_path))
  cfg = config.Config(image_size=8, batch_size=8)
  found, error = onednn_choice._measure(cfg, on, ["float32"])
  assert error == "" and found.onednn is on and found.key["onednn"] is on
  assert found.of("float32").ms_per_step > 0
  # Cached for the run, under this setting's key.
  assert cost_lib.cached(cost_lib.key_for(cfg, on, isa.detect())) is not None


@pytest.mark.parametrize("choice,expect", [
    (dict(on=True, chosen_by="measured"), "on (measured faster)"),
    (dict(on=False, chosen_by="measured"), "off (measured, TF's default kept)"),
    (dict(on=False, chosen_by="environment", env="0"), "off (TF_ENABLE_ONEDNN_OPTS=0)"),
    (dict(on=True, chosen_by="TF's default"), "on (TF's default)"),
])
def test_the_choice_in_the_cost_line(choice, expect):
  from mpt.records.cost import OnednnChoice
  assert OnednnChoice(**{"env": None, "tf_default": None, **choice}).short() == expect
