"""Ground floor: what the machine is, and what it measured.

isa.py (the CPU: model, flags, peak estimate; $MPT_CPUINFO stands in for
/proc/cpuinfo), hardware.py (GPUs, the flag-based fast-path rule, data-sheet peaks),
rates.py (the measured matmul-rate cache), onednn.py (ONEDNN_VERBOSE lines),
kernels.py (the kernel table per op and dtype: probe and cache; $MPT_KERNELS stands in),
fastpath.py (the measured verdict on a policy, flags as the fallback), ceilings.py
(practical ceilings vs theoretical estimates), gpu_kernels.py (xprof kernel stats),
traces.py (a profiler trace through xprof's converter, in a child process: its one
user), xspace.py (a capture's XSpace read directly: GPU planes, kernel events),
kernel_families.py (what a GPU kernel is bound by), gpu_profile.py (what a GPU did in a
capture: device, step time, Tensor Core split; records.gpu.GpuProfile), gpu_specs.py
(which GPU a capture ran on, and its data-sheet float16/float32 ceiling), gpu_table.py
(the kernel table from a GPU capture), cores.py (the cores a run may use), probe_ops.py
(the ops the kernel probe times).
"""
