"""Ground floor: what the machine is.

isa.py (the CPU: model, flags, peak estimate; $MPT_CPUINFO stands in for
/proc/cpuinfo), hardware.py (GPUs, the fast 16-bit path rule, data-sheet peaks),
rates.py (the measured-rate cache: written by the microbenchmark, read by runs).
"""
