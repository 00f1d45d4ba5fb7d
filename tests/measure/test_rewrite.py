"""What TF's oneDNN rewrite measured, told to a script that can no longer choose it
(mpt/measure/rewrite.py): only where TF leaves it off on the CPU (a recorded Zen 3's
cpuinfo standing in) and the process has it off; one real child with it on, this
process without, once per machine and op families (then the cache); the line gives
the one statement that sets it; the diagnosis advises it in a script's words."""

import pytest

from helpers import CPUINFO
from mpt.diagnose.detectors import speed
from mpt.measure import rewrite
from mpt.records.cost import OnednnChoice

ZEN3 = str(CPUINFO / "amd_epyc_zen3_dev_machine.txt")


@pytest.fixture
def zen3(monkeypatch, tmp_path):
  monkeypatch.setenv("MPT_CPUINFO", ZEN3)
  monkeypatch.setenv("MPT_CACHE", str(tmp_path))
  monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)


def test_nothing_to_tell_where_tf_turns_it_on_or_the_process_has_it_or_it_was_set(
    zen3, monkeypatch):
  assert rewrite.note(True, ["matmul"], "bfloat16") is None  # On in this process.
  monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
  assert rewrite.note(False, ["matmul"], "bfloat16") is None  # The script chose.
  monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS")
  monkeypatch.setenv("MPT_CPUINFO", str(CPUINFO / "intel_spr_amx_recorded.txt"))
  assert rewrite.note(False, ["matmul"], "bfloat16") is None  # TF's default is on.


def test_a_zen3_script_is_told_what_the_rewrite_measured_once_per_machine(
    zen3, monkeypatch):
  """The real child (the rewrite on) beside this process' timing of the matmul
  family; the second script on the machine reads the cache (no child runs)."""
  found = rewrite.note(False, ["matmul"], "bfloat16")
  assert found.measured_ms["on"] > 0 and found.measured_ms["off"] > 0, found.why
  assert found.measured == "this model's op families' kernels in float32 (matmul)"
  assert (found.on, found.tf_default, found.chosen_by) == (False, False, "TF's default")
  monkeypatch.setattr(rewrite.subprocess, "run",  # The cache answers, not a child.
                      lambda *a, **k: pytest.fail("measured again"))
  again = rewrite.note(False, ["matmul"], "bfloat16")
  assert again.measured_ms == found.measured_ms and again.source.startswith("cache: ")


def test_the_line_sets_it_before_tensorflow_is_imported_only_where_it_pays():
  choice = lambda on, off: OnednnChoice(
      False, None, False, "TF's default", "TF leaves it off", {"on": on, "off": off},
      4.2, measured="this model's op families' kernels in float32 (conv)")
  line = rewrite.line(choice(10.0, 15.0))
  assert line.startswith("mpt: oneDNN's rewrite is off in this process (TF's default "
                         "on this CPU); this model's op families' kernels in float32 "
                         "(conv) measured ~10.0 ms with it, ~15.0 without (1.5x faster "
                         "with it; measured in 4.2 s)")
  assert line.endswith('put `import os; os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1"` at '
                       "the top of your script, before TensorFlow is imported")
  assert rewrite.line(choice(10.0, 10.4)).endswith(": TF's default is no slower here")


def test_a_script_that_ran_without_it_is_advised_in_its_own_words():
  class Summary:  # The fields the detector reads.
    script, onednn, tf_enable_onednn_opts, policy = True, "off", None, "float32"
    onednn_choice = OnednnChoice(
        False, None, False, "TF's default", "TF leaves it off", {"on": 10.0, "off": 15.0},
        measured="this model's op families' kernels in float32 (conv)")

  class Ev:
    summary = Summary()

  found = speed.onednn(Ev())
  assert found.next_step.startswith(
      'put `import os; os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1"` at the top of your '
      "script")
  assert found.based_on == ["probe"] and "after step 1" in found.threshold
  assert "(conv) measured ~10.0 ms with the rewrite on, ~15.0 off" in found.evidence[0]
