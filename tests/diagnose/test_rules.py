"""The diagnosis as rules (mpt/diagnose/detectors/): no detector calls another, each
runs once per diagnosis, and a superseded detector is not run at all but counted as
clear, as its declared precedence (`SUPERSEDED_BY`) says.
"""

import ast
import json
import shutil

from mpt.diagnose import detectors
from mpt.diagnose import diagnosis as diagnose

from helpers import DATA, ROOT

PACKAGE = ROOT / "mpt" / "diagnose" / "detectors"


def test_no_detector_calls_another():
  names = {f.__name__ for f in detectors.DETECTORS.values()}
  calls = []
  for path in sorted(PACKAGE.glob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.FunctionDef) and node.name in names:
        called = {c.func.id if isinstance(c.func, ast.Name) else c.func.attr
                  for c in ast.walk(node) if isinstance(c, ast.Call)
                  and isinstance(c.func, (ast.Name, ast.Attribute))}
        calls += [f"{path.name}: {node.name} -> {n}" for n in called & names]
  assert not calls, calls
  assert len(names) == len(detectors.DETECTORS) >= 15  # The walk saw them all.


def test_precedence_names_registered_detectors_only():
  for name, firsts in detectors.SUPERSEDED_BY.items():
    assert {name, *firsts} <= set(detectors.DETECTORS), name


def _counted(monkeypatch) -> dict[str, int]:
  counts = dict.fromkeys(detectors.DETECTORS, 0)

  def counting(name, detect):
    def run(ev):
      counts[name] += 1
      return detect(ev)
    return run
  monkeypatch.setattr(detectors, "DETECTORS", {
      n: counting(n, d) for n, d in detectors.DETECTORS.items()})
  return counts


def _gpu_checks() -> set[str]:
  """The detectors a run of the command line never runs: those that read a GPU
  capture (tests/diagnose/test_profile.py runs them) and a script's program record
  (tests/train/common/test_best_effort.py); and the per-layer cost's and XLA's, which the
  recorded runs lack (tests/diagnose/test_diagnose_cost.py), with their numerics
  and float32 over several seeds (tests/diagnose/test_numerics_findings.py)."""
  return {n for n, need in detectors.NEEDS.items() if need in (
      "gpu trace", "program", "layer cost", "xla measured", "numerics.json",
      "float32 seeds")}


def _scenario(tmp_path, name: str):
  """A golden scenario's run folder (tests/data/golden/scenarios.json)."""
  shutil.copytree(DATA / "runs", tmp_path / "runs")
  scenario = json.loads((DATA / "golden" / "scenarios.json").read_text())[name]
  for file, changes in scenario.get("patch", {}).items():
    path = tmp_path / file
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
  return tmp_path / scenario["diagnose"]


def test_each_detector_runs_once_and_a_superseded_one_not_at_all(tmp_path,
                                                                 monkeypatch):
  """The recorded float16 run of the Zen 3 with a Sapphire Rapids kernel verdict: the
  slow kernel explains it, so neither `opportunity` nor `no_speedup` (the float32 run
  next to it measured faster) runs; both count as checked and clear."""
  counts = _counted(monkeypatch)
  report = diagnose.diagnose_run(_scenario(tmp_path, "f16_on_spr"))
  assert [f["id"] for f in report["findings"]] == ["slow_kernel:float16"]
  assert counts["opportunity"] == counts["no_speedup"] == 0
  assert {"opportunity", "no_speedup"} <= set(report["checked_clear"])
  assert {n for n, c in counts.items() if c != 1} == {"opportunity", "no_speedup",
                                                      *_gpu_checks()}


def test_with_nothing_to_supersede_it_every_detector_runs_once(tmp_path, monkeypatch):
  """Float16 on an A100 slower than float32 next to it: no verdict, a fast path by
  the compute capability, so `no_speedup` runs and reports it."""
  counts = _counted(monkeypatch)
  report = diagnose.diagnose_run(_scenario(tmp_path, "f16_on_a100"))
  # The GPU checks need a GPU capture, which this run has not: never run.
  assert {counts[n] for n in _gpu_checks()} == {0}
  assert {c for n, c in counts.items() if n not in _gpu_checks()} == {1}
  assert "no_speedup" in [f["id"] for f in report["findings"]]
