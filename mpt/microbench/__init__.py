"""Wing: `--mode=microbench`, what the CPU can do, what TensorFlow uses, how close it
gets. Measurement only: run.py (the mode; options.py its flags), tfbuild.py, fma.py,
throughput.py and report.py (printing, TensorBoard, and the measurement under
--compare_python's interpreter). The machine's facts live in mpt/machine, and the
measured rates are cached there (mpt/machine/rates.py) for training runs to read.
"""
