"""--mode=compare: the recorded runs' table against a golden file checked by hand, the
speed-ups recomputed from the summary.json files, flagged runs, figures an older
summary.json lacks, bad --runs, --out, the chart with and without matplotlib, and the
command line (which imports no TensorFlow).

The runs are copies of tests/data/runs (see its README.md) in tmp_path; the golden
table is tests/data/compare/golden.md (its README.md says how it was checked).
"""

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from mpt.compare import run as compare
from mpt.compare.options import CompareOptions
from mpt.errors import UserError
from mpt.records.cost import times

from helpers import DATA, ROOT

RECORDED = ("f32_fit", "f32_custom", "f16_custom", "bf16_seed", "slow_input", "skips")
# Each 16-bit run's float32 run of the same configuration (same loop where there is
# one), read off the runs' flags (tests/data/runs/README.md).
BASELINE = {"f16_custom": "f32_custom", "bf16_seed": "f32_fit", "skips": "f32_fit"}


@pytest.fixture
def logs(tmp_path) -> pathlib.Path:
  for name in RECORDED:
    shutil.copytree(DATA / "runs" / name, tmp_path / "logs" / name)
  return tmp_path / "logs"


def patch_summary(run: pathlib.Path, drop=(), **changes) -> pathlib.Path:
  path = run / "summary.json"
  summary = json.loads(path.read_text())
  summary.update(changes)
  for key in drop:
    del summary[key]
  path.write_text(json.dumps(summary))
  return run


def table(md: str) -> dict[str, dict[str, str]]:
  """compare.md's table: {run label: {column: cell}}."""
  rows = [l for l in md.splitlines() if l.startswith("| ")]
  split = lambda l: [c.strip() for c in l[2:-2].split(" | ")]  # Between "| " and " |".
  header, cells = split(rows[0]), [split(r) for r in rows[1:]]
  assert all(len(r) == len(header) for r in cells), cells
  return {r[0]: dict(zip(header, r)) for r in cells}


def summary(name: str) -> dict:
  return json.loads((DATA / "runs" / name / "summary.json").read_text())


def test_the_recorded_runs_give_the_golden_table(logs, capsys):
  result = compare.run(CompareOptions(runs=f"{logs}/*"))
  assert result == {"status": "completed", "run_dir": str(logs), "runs": 6}
  written = (logs / "compare.md").read_text()
  golden = (DATA / "compare" / "golden.md").read_text()
  assert written == golden
  out = capsys.readouterr().out
  assert f"mpt: wrote {logs / 'compare.md'}" in out
  for name in RECORDED:  # The terminal shows the same rows.
    assert name in out


def test_the_golden_speedups_and_figures_are_the_summaries(logs):
  rows = table((DATA / "compare" / "golden.md").read_text())
  assert set(rows) == {"f32_fit", "f32_custom", "f16_custom", "bf16_seed",
                       "slow_input *", "skips *"}
  for label, row in rows.items():
    name = label.rstrip(" *")
    s = summary(name)
    base = summary(BASELINE.get(name, name))
    assert row["vs float32"] == times(base["ms_per_step"] / s["ms_per_step"]), name
    p = s["step_time_ms"]
    assert row["ms/step (p10-p90)"] == (f"{s['ms_per_step']:.1f} ({p['p10']:.1f}-"
                                        f"{p['p90']:.1f})")
    assert row["images/s"] == f"{s['images_per_sec']:.1f}"
    assert row["val acc"] == f"{s['val_accuracy']:.3f}"
    achieved, ceiling = s["achieved_gflops"], s["microbench_gflops"]
    assert row["achieved / ceiling GFLOP/s"] == \
        f"{achieved:.1f} / {ceiling:.0f} ({achieved / ceiling:.0%})"
    assert (row["policy"], row["loop"]) == (s["policy"], s["loop"])
  # The speed-ups of the 16-bit runs, by hand: all slower than float32 on this CPU.
  assert [rows[n]["vs float32"] for n in ("f16_custom", "bf16_seed", "skips *")] == \
      ["0.312x", "0.0917x", "0.292x"]
  assert rows["slow_input *"]["notes"] == "input_work 50 (others 0); epochs 1 (others 4)"
  assert rows["skips *"]["notes"] == \
      "epochs 1 (others 4); steps_per_epoch 30 (others 41)"


def test_a_run_of_another_model_and_batch_is_flagged(logs, capsys):
  patch_summary(logs / "f16_custom", model="resnet", batch_size=64)
  compare.run(CompareOptions(runs=",".join(str(logs / n) for n in
                                           ("f32_fit", "f32_custom", "f16_custom"))))
  rows = table((logs / "compare.md").read_text())
  assert set(rows) == {"f32_fit", "f32_custom", "f16_custom *"}
  odd = rows["f16_custom *"]
  assert odd["notes"] == "model resnet (others seed_convnet); batch_size 64 (others 32)"
  assert odd["vs float32"] == "-"  # No float32 run of its configuration.
  assert rows["f32_fit"]["notes"] == rows["f32_custom"]["notes"] == ""
  assert "*: differs from the other runs" in (logs / "compare.md").read_text()
  assert "f16_custom *" in capsys.readouterr().out


def test_two_runs_that_differ_are_both_flagged_and_the_other_loop_is_named(logs):
  patch_summary(logs / "f32_fit", batch_size=64)
  compare.run(CompareOptions(runs=f"{logs}/f32_fit,{logs}/bf16_seed"))
  rows = table((logs / "compare.md").read_text())
  assert rows["f32_fit *"]["notes"] == "batch_size 64 (others 32)"
  assert rows["bf16_seed *"]["notes"] == "batch_size 32 (others 64)"
  # bf16_seed's only float32 run of the same configuration, in the other loop:
  compare.run(CompareOptions(runs=f"{logs}/f32_custom,{logs}/bf16_seed"))
  row = table((logs / "compare.md").read_text())["bf16_seed"]
  ratio = summary("f32_custom")["ms_per_step"] / summary("bf16_seed")["ms_per_step"]
  assert row["vs float32"] == f"{times(ratio)} (vs custom)"


def test_runs_that_differ_only_in_onednns_rewrite_are_not_the_same_configuration(logs):
  """TF_ENABLE_ONEDNN_OPTS changes which kernels run (1.3x on a Zen 3's float32 step):
  a float32 run with the rewrite on is no baseline for a 16-bit run with it off."""
  patch_summary(logs / "f32_custom", onednn="on")
  patch_summary(logs / "f16_custom", onednn="off")
  compare.run(CompareOptions(runs=f"{logs}/f32_custom,{logs}/f16_custom"))
  rows = table((logs / "compare.md").read_text())
  assert rows["f16_custom *"]["notes"] == "onednn off (others on)"
  assert rows["f16_custom *"]["vs float32"] == "-"
  patch_summary(logs / "f16_custom", onednn="on")
  compare.run(CompareOptions(runs=f"{logs}/f32_custom,{logs}/f16_custom"))
  assert table((logs / "compare.md").read_text())["f16_custom"]["vs float32"] != "-"


def test_figures_an_older_summary_lacks_are_computed_or_shown_as_dashes(logs):
  s = summary("f32_fit")
  patch_summary(logs / "f32_fit", drop=("step_time_ms", "images_per_sec",
                                        "achieved_gflops", "microbench_gflops",
                                        "microbench_gflops_by_dtype"))
  patch_summary(logs / "bf16_seed", drop=("step_time_ms", "images_per_sec",
                                          "flops_per_step", "achieved_gflops",
                                          "val_accuracy"), status="interrupted")
  compare.run(CompareOptions(runs=f"{logs}/f32_fit,{logs}/bf16_seed"))
  rows = table((logs / "compare.md").read_text())
  fit = rows["f32_fit"]
  assert fit["ms/step (p10-p90)"] == f"{s['ms_per_step']:.1f}"
  assert fit["images/s"] == f"{32 / s['ms_per_step'] * 1e3:.1f}"
  achieved = s["flops_per_step"] / s["ms_per_step"] * 1e3 / 1e9
  assert fit["achieved / ceiling GFLOP/s"] == \
      f"{achieved:.1f} / {s['peak_gflops']:.0f} peak ({achieved / s['peak_gflops']:.0%})"
  bf16 = rows["bf16_seed"]
  assert (bf16["val acc"], bf16["achieved / ceiling GFLOP/s"]) == ("-", "-")
  assert bf16["notes"] == "interrupted"
  assert bf16["vs float32"] == \
      times(s["ms_per_step"] / summary("bf16_seed")["ms_per_step"])


def test_a_ceiling_below_the_achieved_rate_is_said_to_be_none(logs):
  """A stale or --quick measured rate below what the run achieved is no ceiling: the
  cell says so instead of printing a share above 100%."""
  s = summary("f32_fit")
  patch_summary(logs / "f32_fit", microbench_gflops=s["achieved_gflops"] / 4)
  compare.run(CompareOptions(runs=f"{logs}/f32_fit,{logs}/f32_custom"))
  rows = table((logs / "compare.md").read_text())
  assert rows["f32_fit"]["achieved / ceiling GFLOP/s"] == (
      f"{s['achieved_gflops']:.1f} / {s['achieved_gflops'] / 4:.0f} "
      "(above it: not a ceiling)")
  assert rows["f32_custom"]["achieved / ceiling GFLOP/s"].endswith("%)")


@pytest.mark.parametrize("runs, message", [
    ("", "--mode=compare needs --runs="),
    ("{logs}/nothing*", "matched nothing"),
    ("{logs}/f32_fit,{logs}/empty", "empty has no summary.json: not a run folder"),
    ("{logs}/gone", "gone does not exist"),
    ("{logs}/em*", "matched no run folder"),
    ("{sweep}", "is a sweep folder; its runs are"),
])
def test_bad_runs_are_one_clear_line(logs, runs, message):
  (logs / "empty").mkdir()
  with pytest.raises(UserError, match=message) as error:
    compare.run(CompareOptions(runs=runs.format(logs=logs,
                                                sweep=DATA / "sweeps" / "oom")))
  assert "\n" not in str(error.value)


def test_a_glob_skips_what_is_not_a_run_and_a_run_counts_once(logs, capsys):
  (logs / "inspect_only").mkdir()
  (logs / "runs.csv").write_text("time\n")
  result = compare.run(CompareOptions(runs=f"{logs}/f32_*,{logs}/*,{logs}/f32_fit/"))
  assert result["runs"] == 6
  out = capsys.readouterr().out
  assert "skipped 1 folder(s) without summary.json: inspect_only" in out
  labels = list(table((logs / "compare.md").read_text()))
  assert len(labels) == 6 and labels[:2] == ["f32_custom", "f16_custom"]


def test_out_puts_the_files_elsewhere_and_says_where_the_runs_are(logs, tmp_path):
  out = tmp_path / "reports" / "today"
  compare.run(CompareOptions(runs=f"{logs}/f32_fit,{logs}/bf16_seed", out=str(out)))
  md = (out / "compare.md").read_text()
  assert f"Run folders are relative to `{logs}`." in md
  assert not (logs / "compare.md").exists()


def test_the_chart_is_a_png_and_without_matplotlib_one_line_says_so(logs, capsys,
                                                                    monkeypatch):
  pytest.importorskip("matplotlib")
  compare.run(CompareOptions(runs=f"{logs}/*"))
  assert (logs / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  (logs / "compare.png").unlink()
  capsys.readouterr()
  monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails.
  compare.run(CompareOptions(runs=f"{logs}/*"))
  out = capsys.readouterr().out
  assert [l for l in out.splitlines() if "compare.png" in l] == [
      "mpt: compare.png skipped: matplotlib is not installed (pip install matplotlib)"]
  assert not (logs / "compare.png").exists() and (logs / "compare.md").exists()


def test_the_command_line_compares_without_tensorflow(logs):
  probe = ("import runpy, sys\nsys.argv = ['mpt'] + sys.argv[1:]\n"
           "try:\n  runpy.run_module('mpt.main', run_name='__main__')\n"
           "except SystemExit as e:\n  print('EXIT', e.code)\n"
           "print('IMPORTED', sorted(m for m in ('tensorflow', 'keras') "
           "if m in sys.modules))")
  proc = subprocess.run([sys.executable, "-c", probe, "--mode=compare",
                         f"--runs={logs}/*"], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)
  assert "EXIT 0" in proc.stdout and "IMPORTED []" in proc.stdout, proc.stderr[-2000:]
  assert (logs / "compare.md").read_text() == \
      (DATA / "compare" / "golden.md").read_text()
  bad = subprocess.run([sys.executable, "-m", "mpt.main", "--mode=compare",
                        f"--runs={logs}/nothing*"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
  assert bad.returncode == 2
  assert bad.stderr.strip() == f"mpt: error: --runs: '{logs}/nothing*' matched nothing"


def test_runs_from_several_machines_are_a_block_each(tmp_path):
  """Run folders copied from two machines into one logdir (the recorded Zen 4 and
  Sapphire Rapids runs): one table per machine, each 16-bit run against its own
  machine's float32 run (the speed-ups recomputed from the summaries)."""
  logs = tmp_path / "logs"
  for name in ("f32_fit", "bf16_seed"):
    shutil.copytree(DATA / "runs" / name, logs / name)
  for run in (DATA / "runs" / "spr_amx").iterdir():
    shutil.copytree(run, logs / f"spr_{run.name}")
  compare.run(CompareOptions(runs=f"{logs}/*"))
  md = (logs / "compare.md").read_text()
  blocks = md.split("## On ")[1:]
  assert [b.splitlines()[0] for b in blocks] == ["AMD EPYC", "Intel(R) Xeon(R) Processor"]
  plain = lambda rows: {k.split(" ")[0]: v for k, v in rows.items()}  # No " *" flag.
  amd, spr = plain(table(blocks[0])), plain(table(blocks[1]))
  assert set(amd) == {"f32_fit", "bf16_seed"} and len(spr) == 3
  ms = lambda label: json.loads((logs / label / "summary.json").read_text())["ms_per_step"]
  spr_f32 = next(l for l in spr if "float32" in l)
  for label, cells in spr.items():
    assert cells["vs float32"] == times(ms(spr_f32) / ms(label)), (label, cells)
  assert amd["bf16_seed"]["vs float32"] == times(ms("f32_fit") / ms("bf16_seed"))


def test_runs_over_seeds_get_accuracy_beside_speed(logs, capsys):
  """The recorded float32 fit run again with seeds 1 and 2 (its final accuracy 0.01
  above and below), and the bfloat16 run of the same configuration 0.2 below it: its
  metrics beside float32's spread over the three seeds, in the terminal and in
  compare.md."""
  f32 = json.loads((logs / "f32_fit" / "summary.json").read_text())
  accuracy = f32["val_accuracy"]
  for seed, moved in ((1, 0.01), (2, -0.01)):
    shutil.copytree(logs / "f32_fit", logs / f"f32_fit_s{seed}")
    patch_summary(logs / f"f32_fit_s{seed}", seed=seed, val_accuracy=accuracy + moved)
  patch_summary(logs / "bf16_seed", val_accuracy=accuracy - 0.2, steps=f32["steps"],
                epochs=f32["epochs"], seed=0)
  compare.run(CompareOptions(runs=",".join(
      str(logs / n) for n in ("f32_fit", "f32_fit_s1", "f32_fit_s2", "bf16_seed"))))
  out = capsys.readouterr().out
  said = out.split("accuracy beside speed (final metrics over seeds):\n")[1]
  assert "float32 (3 seeds): " in said and "float32's spread" in said
  assert "mixed_bfloat16 (1 seeds): " in said
  assert "OUTSIDE float32's spread: " in said
  assert (f"val_accuracy {accuracy - 0.2:.4g} outside float32's {accuracy - 0.01:.4g}.."
          f"{accuracy + 0.01:.4g} (3 seeds)") in said
  assert "## Accuracy beside speed" in (logs / "compare.md").read_text()
