"""mpt/console.py's import of TensorFlow, in a process of its own (an import happens
once per process: the test's worker imported TensorFlow long before)."""

import subprocess
import sys

from helpers import ROOT, script_forked

# TensorFlow imported as mpt's processes import it, then what a chart of mpt's needs.
PROBE = """
import sys
from mpt import console
console.import_tensorflow()
import keras
print("AFTER TF", sorted(m for m in ("tensorflow", "keras", "matplotlib") if m in sys.modules))
from keras.src.visualization import plot_image_gallery
print("KERAS PYPLOT", plot_image_gallery.plt)
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
plt.figure()
print("PYPLOT", plt.__name__)
"""


def test_tensorflows_import_leaves_pyplot_out_and_importable_after():
  """Keras' optional pyplot import (0.7 s of CPU of TF's 4 s) is skipped in mpt's own
  processes, and matplotlib still imports for mpt's own charts afterwards."""
  proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.splitlines()
  assert "AFTER TF ['keras', 'tensorflow']" in lines, proc.stdout
  assert "KERAS PYPLOT None" in lines, proc.stdout
  assert "PYPLOT matplotlib.pyplot" in lines, proc.stdout


def test_a_forked_run_starts_with_tensorflow_imported_as_mpt_imports_it(tmp_path):
  """The fork server's preload (tests/forkserver_preload.py) took: a run forked from it
  has TensorFlow and mpt's training wing, and no pyplot (multiprocessing skips a
  preload it cannot import without a word: every forked run would pay the import)."""
  script = tmp_path / "modules.py"
  script.write_text("import sys\nprint(sorted(m for m in ('tensorflow', 'mpt.train.cli.run',"
                    " 'matplotlib') if m in sys.modules))\n")
  proc = script_forked(script, cwd=tmp_path)
  assert proc.stdout.split("\n")[0] == "['mpt.train.cli.run', 'tensorflow']", proc.stdout
