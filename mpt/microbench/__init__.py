"""Wing: `--mode=microbench`, what the CPU can do, what TensorFlow uses, how close it
gets. Measurement only: run.py (the mode; __main__.py runs it alone; options.py its
flags), tfbuild.py, fma.py, throughput.py and
report.py (printing and TensorBoard). The machine's facts live in mpt/machine, and the
measured rates are cached there (mpt/machine/rates.py) for training runs to read.
"""
