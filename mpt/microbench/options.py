"""The microbenchmark's own flags: matrix sizes, dtypes, --quick, --compare_python."""

import dataclasses

from mpt.config import flag


@dataclasses.dataclass
class MicrobenchOptions:
  """Field names are the command-line flag names (mpt/main.py)."""
  microbench_sizes: str = flag("256,512,1024,2048", "--mode=microbench: square "
                                 "matmul sizes, comma-separated.")
  microbench_dtypes: str = flag("float32,bfloat16,float16", "--mode=microbench: "
                                  "matmul/conv dtypes, comma-separated.")
  quick: bool = flag(False, "--mode=microbench: tiny sizes and few samples "
                       "(seconds; for tests).")
  compare_python: str = flag("", "--mode=microbench: also measure under this "
                               "Python interpreter (e.g. a venv with a source-built "
                               "TensorFlow) and print both columns and their ratio.")
