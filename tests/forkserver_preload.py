"""What the fork server of helpers.py (`Forked`) imports before it forks a run:
TensorFlow as mpt's own processes import it (mpt/console.py: without Keras' pyplot),
then Keras and mpt's training wing and diagnosis, so that a forked run starts at
mpt's first line of work."""

from mpt import console

with console.without_pyplot():
  import tensorflow  # noqa: F401
import keras  # noqa: F401,E402
import mpt.main  # noqa: F401,E402
import mpt.train.cli.run  # noqa: F401,E402
import mpt.diagnose.diagnosis  # noqa: F401,E402
