"""Child entry point for `--compare_python`: measures under this interpreter and prints
the results as one `MPT-RESULT {json}` line. Needs only TensorFlow and numpy (no absl):

  PYTHONPATH=<mpt checkout> python -m mpt.microbench '{"sizes": [256], ...}'
"""

import json
import sys

from mpt.microbench import run as microbench

if __name__ == "__main__":
  args = json.loads(sys.argv[1])
  results = microbench.measure(args["sizes"], args["dtypes"], args["quick"],
                               kernel_table=args.get("kernels", True))
  print("MPT-RESULT " + json.dumps(results), flush=True)
