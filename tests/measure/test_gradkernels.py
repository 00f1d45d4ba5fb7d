"""The weight-gradient kernels timed in-process where no kernel table is cached
(mpt/measure/gradkernels.py): rows in the kernel table's own form, only the asked
families', read by the same fastpath rules; never cached as the machine's table. No
timed assertion: only that each kernel ran and was timed."""

import json

from mpt.machine import fastpath
from mpt.machine import kernels
from mpt.measure import gradkernels

from helpers import DATA


def test_the_rows_are_the_kernel_tables_own_for_the_families_asked():
  """The rows' shape only: their ops, dtypes, a time each and float32's ratio 1. What
  a kernel costs here is the host's, so no figure is asserted (the timing rules are
  tests/measure/test_timer.py's, on recorded calls)."""
  found = gradkernels.table(["conv"])
  assert {(r["op"], r["dtype"]) for r in found["rows"]} == {
      ("Conv2DBackpropFilter", d) for d in kernels.DTYPES}
  assert all(r["ms"] > 0 for r in found["rows"])
  assert [r["ratio"] for r in found["rows"] if r["dtype"] == "float32"] == [1.0]
  ratios = fastpath.policy_ratios(found, ["conv"])
  assert set(ratios) == {"float32", "mixed_bfloat16", "mixed_float16"}
  assert gradkernels.table(["matmul"], dtypes=("float32",))["rows"][0]["op"] == \
      "MatMul/grad_weights"


def test_a_quick_table_stands_in_for_a_missing_one_and_is_not_cached(monkeypatch,
                                                                      tmp_path):
  monkeypatch.setenv("MPT_CACHE", str(tmp_path))
  monkeypatch.delenv("MPT_KERNELS", raising=False)
  quick = {"rows": [{"op": "Conv2DBackpropFilter", "dtype": "float32", "ms": 1.0}]}
  assert kernels.table(probe_if_missing=False, missing=lambda: quick) == (quick, None)
  assert not kernels.cache_path().exists()
  monkeypatch.setenv("MPT_KERNELS", "none")  # Nothing measured, by request.
  assert kernels.table(probe_if_missing=False, missing=lambda: quick) == (None, None)
  recorded = DATA / "kernels" / "intel_spr_amx_recorded.json"
  monkeypatch.setenv("MPT_KERNELS", str(recorded))
  table, _ = kernels.table(probe_if_missing=False, missing=lambda: quick)
  assert table["rows"] == json.loads(recorded.read_text())["rows"]
