"""The diagnosis' words, byte for byte: each scenario of tests/data/golden/scenarios.json
(a recorded run or sweep folder, some with summary.json, dtypes.json or op_stats.json
patched as a run on another machine, GPU or with another measurement would have
written them) is diagnosed, and what
it printed, diagnosis.md and diagnosis.json must equal tests/data/golden/<scenario>.txt.

The goldens were written by the diagnosis at 64912f0, before the records were typed
(issue 28), and checked by reading them; the scenarios' patches are data written
then with the old `kernels` key, so they also prove that old files still read.
`pytest --write-goldens tests/diagnose/test_golden.py` rewrites them and skips every
scenario (a rewrite checks nothing): only for a change of words that is meant, and
read the diff. (conftest.py turns that option into MPT_GOLDEN=write, and drops an
MPT_GOLDEN set in the shell.)
"""

import json
import os
import pathlib
import shutil

import pytest

from mpt.diagnose import diagnosis as diagnose

from helpers import DATA, ROOT

GOLDEN = DATA / "golden"
SCENARIOS = json.loads((GOLDEN / "scenarios.json").read_text())


def _setup(tmp: pathlib.Path, scenario: dict) -> pathlib.Path:
  for part in ("runs", "sweeps"):
    shutil.copytree(DATA / part, tmp / part)
  for file, changes in scenario.get("patch", {}).items():  # Top-level keys replaced.
    path = tmp / file
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
  for folder in scenario.get("remove", []):
    shutil.rmtree(tmp / folder)
  return tmp / scenario["diagnose"]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_diagnosis_words_are_the_golden_ones(name, tmp_path, capsys):
  folder = _setup(tmp_path, SCENARIOS[name])
  diagnose.diagnose_folder(folder)
  parts = ["# printed", capsys.readouterr().out, "# diagnosis.md",
           (folder / "diagnosis.md").read_text(), "# diagnosis.json",
           (folder / "diagnosis.json").read_text()]
  got = "\n".join(parts).replace(str(tmp_path), "<tmp>")
  path = GOLDEN / f"{name}.txt"
  if os.environ.get("MPT_GOLDEN") == "write":
    path.write_text(got)
    pytest.skip(f"wrote {path.relative_to(ROOT)}: read its diff")
  assert got == path.read_text(), f"{name}: the diagnosis' words changed"
