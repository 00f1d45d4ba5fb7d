"""The cores a run may use: the process' affinity mask (a SLURM cpuset, `taskset`, a
container's cpuset), capped by its cgroup's CPU quota (`docker --cpus`, a Kubernetes
CPU limit, systemd's CPUQuota), not the host's count. Read from /proc and the cgroup
file system; where they cannot be read, there is no quota."""

import math
import os
import pathlib

PROC = pathlib.Path("/proc")
CGROUP = pathlib.Path("/sys/fs/cgroup")


def affinity() -> list[int]:
  """The CPUs this process may run on (a SLURM cpuset, `taskset`, a container)."""
  try:
    return sorted(os.sched_getaffinity(0))
  except (AttributeError, OSError):  # Not Linux.
    return list(range(os.cpu_count() or 1))


def cpu_quota() -> float | None:
  """The cgroup's CPU quota in cores (cgroup v2 cpu.max, v1 cpu.cfs_quota_us over
  cpu.cfs_period_us), or None where there is none or it cannot be read.

  A v1 container (Docker, Kubernetes) lists its cgroup's full path in
  /proc/self/cgroup (`/docker/<id>`) but has that cgroup mounted as the controller's
  root (moby/moby#34584): where the path is not under the mount, the root is read.
  """
  try:
    lines = (PROC / "self" / "cgroup").read_text().splitlines()
  except OSError:
    return None
  for line in lines:
    _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
    if controllers == "":
      mount, names = CGROUP, ("cpu.max",)
    elif "cpu" in controllers.split(","):
      mount, names = CGROUP / controllers, ("cpu.cfs_quota_us", "cpu.cfs_period_us")
    else:
      continue
    for folder in dict.fromkeys([mount / path.strip().lstrip("/"), mount]):
      try:
        texts = [(folder / name).read_text() for name in names]
      except OSError:
        continue
      quota, period = texts if len(texts) == 2 else (texts[0].split() + ["0"])[:2]
      try:  # "max" (v2) and -1 (v1): no quota.
        cores = float(quota) / float(period)
      except (ValueError, ZeroDivisionError):
        break
      if cores > 0:
        return cores
      break  # This cgroup has no quota; another line may.
  return None


def usable_cores() -> int:
  """The cores this process can use: its affinity mask, capped by a cgroup quota
  (rounded up), not the host's count."""
  quota = cpu_quota()
  n = len(affinity())
  return max(1, min(n, math.ceil(quota))) if quota else n
