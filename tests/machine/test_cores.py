"""The cores a run may use (mpt/machine/cores.py): its affinity mask, capped by a
cgroup CPU quota read from /proc/self/cgroup and cgroup files recorded in the formats
of cgroups(7) (v1 and v2, a host, a unit, a container). The count beside the host's in
the device name and summary.json: test_hardware.py."""

import os
import pathlib

import pytest

from mpt.machine import cores


def _write(path: pathlib.Path, text: str) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)


K8S_POD = ("/kubepods/besteffort/pod9a18ffb8-8513-11e7-b26e-7e29fbe2a5a3/"
           "d28e0087cf8f3f0429f755d60b0de415b20fcf76736ded7bab6e30e7b739ee36")


# (/proc/self/cgroup, {file under /sys/fs/cgroup: its text}, the quota in cores), in
# the formats of cgroups(7); each v1 host also has the root cgroup's unlimited files.
V1_ROOT = {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
           "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}
QUOTAS = {
    # v2 in a container with its own cgroup namespace (Docker's default on v2):
    # `docker run --cpus=1.5`.
    "v2 container": ("0::/\n", {"cpu.max": "150000 100000\n"}, 1.5),
    # v2, a systemd unit with CPUQuota=250%.
    "v2 unit": ("0::/system.slice/train.service\n",
                {"system.slice/train.service/cpu.max": "250000 100000\n"}, 2.5),
    "v2 no quota": ("0::/user.slice/user-1000.slice/session-2.scope\n",
                    {"user.slice/user-1000.slice/session-2.scope/cpu.max":
                     "max 100000\n"}, None),
    # v1 on a hybrid host (v1 controllers, the v2 tree for systemd only): the cgroup
    # under the controller's mount, by its path.
    "v1 host": ("12:memory:/batch/job7\n4:cpu,cpuacct:/batch/job7\n"
                "1:name=systemd:/user.slice\n0::/user.slice\n",
                {**V1_ROOT, "cpu,cpuacct/batch/job7/cpu.cfs_quota_us": "400000\n",
                 "cpu,cpuacct/batch/job7/cpu.cfs_period_us": "100000\n"}, 4.0),
    # v1 in a Kubernetes container, as moby/moby#34584 recorded it: the full path
    # listed, the container's cgroup mounted as the controller's root.
    "v1 container": (f"2:cpu:{K8S_POD}\n1:name=systemd:{K8S_POD}\n",
                     {"cpu/cpu.cfs_quota_us": "50000\n",
                      "cpu/cpu.cfs_period_us": "100000\n"}, 0.5),
    "v1 no quota": ("4:cpu,cpuacct:/\n", V1_ROOT, None),
    "no cpu controller": ("3:memory:/a\n", {"memory/a/memory.limit_in_bytes": "1\n"},
                          None),
}


@pytest.mark.parametrize("host", QUOTAS)
def test_the_cgroup_cpu_quota_in_cores(monkeypatch, tmp_path, host):
  proc_cgroup, files, quota = QUOTAS[host]
  _write(tmp_path / "proc" / "self" / "cgroup", proc_cgroup)
  for name, text in files.items():
    _write(tmp_path / "cgroup" / name, text)
  monkeypatch.setattr(cores, "PROC", tmp_path / "proc")
  monkeypatch.setattr(cores, "CGROUP", tmp_path / "cgroup")
  assert cores.cpu_quota() == quota


def test_without_proc_self_cgroup_there_is_no_quota(monkeypatch, tmp_path):
  monkeypatch.setattr(cores, "PROC", tmp_path / "not-linux")
  assert cores.cpu_quota() is None


@pytest.mark.parametrize("cpus,quota,usable", [
    (4, None, 4), (4, 1.5, 2), (4, 2.0, 2), (4, 0.2, 1), (4, 16.0, 4), (1, 2.0, 1)])
def test_usable_cores_are_the_affinity_mask_capped_by_the_quota_rounded_up(
    monkeypatch, cpus, quota, usable):
  monkeypatch.setattr(cores, "affinity", lambda: list(range(cpus)))
  monkeypatch.setattr(cores, "cpu_quota", lambda: quota)
  assert cores.usable_cores() == usable


@pytest.mark.skipif(len(cores.affinity()) < 2,
                    reason="one CPU: no smaller affinity mask to give")
def test_a_smaller_affinity_mask_is_read_from_the_process():
  """This thread's real mask narrowed to one CPU, as a SLURM cpuset or taskset gives
  a process (tests/test_exits.py checks a training child records the mask it has)."""
  mask = os.sched_getaffinity(0)
  os.sched_setaffinity(0, {max(mask)})  # The calling thread only.
  try:
    assert cores.affinity() == [max(mask)] and cores.usable_cores() == 1
  finally:
    os.sched_setaffinity(0, mask)
