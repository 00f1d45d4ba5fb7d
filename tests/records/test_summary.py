"""summary.json as a typed record (mpt/records/summary.py, typed.py): every recorded file
reads back with no key left over at any depth, old versions read through `upgrade`, a
sub-record that is not one fails loudly, and the float32-baseline rule both the
diagnosis and `--mode=compare` use.

The recorded files are real runs' (tests/data/runs, tests/data/sweeps: see their
README.md), written by mpt before the schema had a version; a renamed field on either
side (the writer's key or the record's field) shows up as a key left over.
"""

import dataclasses
import json

import pytest

from mpt.errors import UserError
from mpt.records import summary as summary_lib
from mpt.records import typed
from mpt.records.program import Fit, OptimizerRecord, Program
from mpt.records.machine import Hardware, Stat, Utilisation
from mpt.records.memory import Estimate, Line, MemoryPlan
from mpt.records.summary import RunSummary
from mpt.machine import fastpath
from mpt.records.cost import Cost, PolicyCost
from mpt.records.verdict import BESIDE, Candidate, PolicyChoice, PolicyVerdict
from mpt.train.before_step1 import autopolicy

from helpers import DATA

RECORDED = sorted(DATA.glob("**/summary.json"))
GOLDEN_PATCHES = json.loads((DATA / "golden" / "scenarios.json").read_text())


def test_there_are_recorded_files_to_read():
  versions = {json.loads(p.read_text()).get("schema_version", 1) for p in RECORDED}
  assert len(RECORDED) >= 10 and 1 in versions, (len(RECORDED), versions)


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: str(p.relative_to(DATA)))
def test_every_recorded_summary_reads_with_nothing_left_over(path):
  unknown = []
  s = RunSummary.from_dict(json.loads(path.read_text()), unknown)
  assert unknown == [], unknown
  assert s.hardware is None or isinstance(s.hardware, Hardware)
  stats = [getattr(s.util, f.name) for f in dataclasses.fields(Utilisation)] \
      if s.util else []
  assert all(v is None or isinstance(v, Stat) for v in stats)


def test_the_patches_of_other_machines_read_with_nothing_left_over():
  """The verdicts, memory plans and choices the golden scenarios patch in, as the
  versions before 3 wrote them (`kernels`), at every depth."""
  for name, scenario in GOLDEN_PATCHES.items():
    for file, changes in scenario.get("patch", {}).items():
      if file.endswith("summary.json"):
        unknown = []
        s = RunSummary.from_dict({"schema_version": 2, **changes}, unknown)
        assert unknown == [], (name, unknown)
        if "kernels" in changes:
          assert isinstance(s.policy_verdict, PolicyVerdict), name
          assert s.policy_verdict.ratio == changes["kernels"]["ratio"]


def full_summary() -> RunSummary:
  est = Estimate("mixed_float16", 32, 700.0, 4.0, 4.0, 8.0, 2.0, 1.5, 0.05, True)
  return RunSummary(
      status="completed", policy="mixed_float16", ms_per_step=12.5,
      policy_verdict=PolicyVerdict("cost", False, 1.25, fastest="float32",
                                   fastest_ratio=1.0,
                                   policy_ratios={"float32": 1.0, "mixed_float16": 1.25}),
      policy_choice=PolicyChoice("auto", "float32", 3, [
          Candidate("float32", 20.0, 10.0, time_vs_float32=1.0),
          Candidate("mixed_float16", dropped="predicted 1.3x the fastest")], 4.5),
      memory=MemoryPlan(est, {"mixed_float16": round(est.total_mb, 1)},
                        {"mixed_float16": est.line()}, 20000.0, "available RAM", 1,
                        900.0, None, 1.1),
      util=Utilisation(Stat(150.0, 199.0), Stat(80.0, 100.0)),
      hardware=typed.from_dict(Hardware, {"cpu": "x", "cpu_count": 2, "gpus": [
          {"name": "A100", "compute_capability": [8, 0]}], "tf32": True}),
      api="mpt.callbacks", metrics={"loss": 0.5, "binary_accuracy": 0.75},
      program=Program(
          api="mpt.callbacks", policy="mixed_float16", batch_size=32, batch_size_given=64,
          fits=[Fit(3, 10, 30, 3)], optimizers=[OptimizerRecord(
              "lso", "LossScaleOptimizer", "Adam", 1e-3, 32768.0, 0, 30, True, True)],
          inputs={"features/age": [1]}, models=["net"]))


def test_a_script_run_before_version_4_is_told_by_its_dataset():
  old = {"schema_version": 3, "status": "completed", "dataset": "user", "loop": "custom"}
  assert RunSummary.from_dict(old).api == "mpt.track"
  assert RunSummary.from_dict({**old, "loop": "fit"}).api == "mpt.callbacks"
  cli = RunSummary.from_dict({**old, "dataset": "synthetic"})
  assert cli.api == "cli" and not cli.script


def test_a_whole_summary_survives_the_file_unchanged(tmp_path):
  s = full_summary()
  s.write(tmp_path / "summary.json")
  written = json.loads((tmp_path / "summary.json").read_text())
  assert written["schema_version"] == summary_lib.SCHEMA_VERSION == 6
  # No copies of other records: each fact once.
  assert not {"slow_path_warning", "onednn", "tf_enable_onednn_opts",
              "microbench_gflops"} & set(written)
  assert "kernels" not in written and written["policy_verdict"]["evidence"] == "cost"
  # The estimate writes its derived totals for readers of the file, as before.
  assert written["memory"]["estimate"]["total_mb"] == round(s.memory.estimate.total_mb, 1)
  unknown = []
  assert RunSummary.from_dict(written, unknown) == s and unknown == []
  assert summary_lib.read(tmp_path / "summary.json").gpu_caps == [(8, 0)]


def test_each_per_policy_figure_is_written_once_in_the_cost_and_read_back(tmp_path):
  """The verdict's ratios and auto's uniform candidates' times are the cost's: the
  file holds them once (in `cost`), the reader puts them back; a plan's own
  side-by-side times stay the choice's."""
  cost = Cost({"cpu": "x"}, True, 32, policies=[
      PolicyCost("float32", 10.0, 40.0, 20.0, steps_timed=2),
      PolicyCost("mixed_float16", 12.5, 60.0, 30.0, steps_timed=2),
      PolicyCost("mixed_bfloat16", ms_per_step=80.0, predicted=True, stopped="p")])
  choice = autopolicy.choose(cost)[2]
  choice.candidates.append(Candidate("float32", 41.0, 9.0, dropped=BESIDE))
  s = RunSummary(status="completed", policy="mixed_float16", cost=cost,
                 policy_verdict=fastpath.verdict("mixed_float16", None, ["conv"], set(),
                                                 [], "x", cost.predicted()),
                 policy_choice=choice)
  s.write(tmp_path / "summary.json")
  text = (tmp_path / "summary.json").read_text()
  written = json.loads(text)
  assert written["policy_verdict"]["evidence"] == "cost"
  assert "policy_ratios" not in written["policy_verdict"]
  assert [sorted(set(Candidate.TIMED) & set(c)) for c in
          written["policy_choice"]["candidates"]] == [[], [], [], sorted(Candidate.TIMED)]
  assert text.count("12.5") == 1 and text.count("80.0") == 1  # In `cost` only.
  back = summary_lib.read(tmp_path / "summary.json")
  assert back == s
  # Independent of mpt's arithmetic: the ratios and times as the rows give them.
  assert back.policy_verdict.policy_ratios == {
      "float32": 1.0, "mixed_float16": 1.25, "mixed_bfloat16": 8.0}
  assert [(c.policy, c.ms_per_step, c.time_vs_float32, c.predicted_ms)
          for c in back.policy_choice.candidates] == [
      ("float32", 10.0, 1.0, None), ("mixed_bfloat16", 80.0, 8.0, 80.0),
      ("mixed_float16", 12.5, 1.25, None), ("float32", 9.0, None, None)]


def test_an_older_files_candidate_ratio_reads_as_time_over_float32s():
  """Files before `time_vs_float32` kept float32's ms over the candidate's (a plan's
  row keeps its own): read inverted, written under the new name only."""
  unknown = []
  s = RunSummary.from_dict({"policy_choice": {"candidates": [
      {"policy": "mixed_float16", "layer_policy": "conv=float32", "ms_per_step": 8.0,
       "vs_float32": 1.25}]}}, unknown)
  assert unknown == [] and s.policy_choice.candidates[0].time_vs_float32 == 0.8
  written = s.to_dict()["policy_choice"]["candidates"][0]
  assert written["time_vs_float32"] == 0.8 and "vs_float32" not in written


def test_a_renamed_key_is_left_over_not_read_as_none():
  data = typed.to_dict(full_summary())
  data["policy_verdict"]["ratios"] = data["policy_verdict"].pop("ratio")
  data["util"]["cpu_percent"] = data["util"].pop("process_cpu_percent")
  unknown = []
  s = RunSummary.from_dict(data, unknown)
  assert unknown == ["policy_verdict.ratios", "util.cpu_percent"]
  with pytest.raises(AttributeError):
    s.policy_verdict.ratios  # pylint: disable=pointless-statement


def test_older_versions_read_through_one_set_of_rules():
  v1 = RunSummary.from_dict({"status": "completed", "hardware": {}})
  assert (v1.schema_version, v1.hardware, v1.batchnorm) == (1, None, "keras")
  v2 = RunSummary.from_dict({"schema_version": 2, "kernels": {"evidence": "probe"}})
  assert v2.policy_verdict == PolicyVerdict("probe")
  # Version 3 has no `kernels`: a newer file's unknown key, dropped.
  unknown = []
  v3 = RunSummary.from_dict({"schema_version": 3, "kernels": {"evidence": "probe"}},
                            unknown)
  assert v3.policy_verdict is None and unknown == ["kernels"]


def test_a_version_4_files_copies_are_folded_into_the_records_they_copied():
  v4 = {"schema_version": 4, "compute_dtype": "bfloat16",
        "slow_path_warning": "w", "policy_verdict": {"evidence": "cost", "text": "w"},
        "onednn": "off", "tf_enable_onednn_opts": "0",
        "onednn_choice": {"on": True, "env": None, "tf_default": True},
        "microbench_gflops": 55.0, "microbench_gflops_by_dtype": {"float32": 40.0}}
  unknown = []
  s = RunSummary.from_dict(v4, unknown)
  assert unknown == [] and s.slow_path_warning == "w"
  # A copy an older reader read (and a test edited) wins over the record it copied.
  assert (s.onednn, s.tf_enable_onednn_opts) == ("off", "0")
  assert s.onednn_choice.on is False and s.onednn_choice.tf_default is True
  assert s.microbench_gflops == 55.0 and s.microbench_gflops_by_dtype == {
      "float32": 40.0, "bfloat16": 55.0}
  bare = RunSummary.from_dict({"schema_version": 3, "onednn": "on"})
  assert bare.onednn == "on" and bare.onednn_choice.env is None
  assert RunSummary.from_dict({"schema_version": 4}).onednn is None


def test_a_sub_record_that_is_not_one_fails_loudly(tmp_path):
  path = tmp_path / "summary.json"
  path.write_text(json.dumps({"memory": {"estimate": {"policy": "float32"}}}))
  with pytest.raises(UserError, match=r"not a run summary: memory.estimate: .*missing"):
    summary_lib.read(path)
  path.write_text(json.dumps({"util": {"rss_mb": 3}}))
  with pytest.raises(UserError, match="util.rss_mb: not a JSON object"):
    summary_lib.read(path)


def test_the_float32_baseline_is_the_same_configuration_same_loop_then_newest():
  run = RunSummary(policy="mixed_bfloat16", loop="fit", model="m", batch_size=32)
  f32 = lambda **kw: dataclasses.replace(run, policy="float32", **kw)
  candidates = [(f32(loop="custom"), 5.0, "custom, newest"), (f32(), 1.0, "fit, old"),
                (f32(), 2.0, "fit, newer"), (f32(batch_size=64), 9.0, "other batch"),
                (dataclasses.replace(run), 9.0, "not float32")]
  assert summary_lib.baseline_of(run, candidates) == "fit, newer"
  assert summary_lib.baseline_of(run, candidates[:1]) == "custom, newest"
  assert summary_lib.baseline_of(run, candidates[3:]) is None
  assert summary_lib.baseline_of(f32(), candidates) is None  # float32 has none.


def test_the_memory_line_is_the_estimate_at_any_batch():
  est = Estimate("float32", 32, 700.0, 4.0, 4.0, 8.0, 0.0, 2.0, 0.5)
  assert est.line().total_mb(32) == pytest.approx(est.total_mb)
  assert est.line() == Line(716.0, 2.5, 700.0)
