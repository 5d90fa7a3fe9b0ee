"""What this host offers the run: the cores this process may use (its affinity and its cgroup's
CPU quota) and the CPU's model and bfloat16 units, from the kernel's own files."""
import math
import os
from pathlib import Path


def usable_cores():
    """The cores this process may use, not the machine's: its affinity (taskset, cpusets, Slurm) and
    its cgroup's CPU quota (Docker --cpus, a Kubernetes limit), rounded up."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cpu_quota()
    return max(1, min(cores, math.ceil(quota))) if quota else cores


def cpu_quota():
    """The CPUs this process's cgroup (and its parents) may use, as a number such as 2.5, or None
    without a quota; cgroup v2 (cpu.max) or v1 (cpu.cfs_quota_us / cpu.cfs_period_us)."""
    try:
        memberships = [line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()]
        mounts = [line.split(" - ") for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    except OSError:
        return None
    limits = []
    for before, after in (m for m in mounts if len(m) == 2):
        fields, (fstype, _, options) = before.split(), after.split()[:3]
        root, mount_point = fields[3], fields[4]
        for _, controllers, path in memberships:
            if fstype == "cgroup2" and controllers == "":
                files = ("cpu.max",)
            elif fstype == "cgroup" and "cpu" in controllers.split(",") and "cpu" in options.split(","):
                files = ("cpu.cfs_quota_us", "cpu.cfs_period_us")
            else:
                continue
            folder = Path(mount_point) / os.path.relpath(path, root)
            while folder.is_relative_to(mount_point):  # this cgroup and the ones above it
                limits.append(quota_in(folder, files))
                folder = folder.parent
    limits = [limit for limit in limits if limit]
    return min(limits) if limits else None


def quota_in(folder, files):
    """CPUs of the quota that ``files`` in a cgroup ``folder`` set, or None (none, or unreadable)."""
    try:
        values = " ".join((folder / name).read_text().strip() for name in files).split()
        quota, period = int(values[0]), int(values[1])  # cpu.max: 'max 100000' when there is none
    except (OSError, ValueError, IndexError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def cpuinfo_field(name):
    """The first value of ``name`` in /proc/cpuinfo ('' where there is none)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next((line.split(":", 1)[1].strip() for line in cpuinfo
                         if line.split(":", 1)[0].strip() == name), "")
    except OSError:
        return ""


def cpu_bf16_features():
    """The bfloat16 matrix and vector units of this CPU that torch's kernels use (AMX, AVX512-BF16),
    from the kernel's /proc/cpuinfo flags; [] elsewhere."""
    flags = cpuinfo_field("flags").split()
    return [name for flag, name in (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"))
            if flag in flags]


def cpu_model():
    """The CPU and its bfloat16 units, for benchmark tables: 'CPU AMD EPYC, bf16 units: none'."""
    return (f"CPU {cpuinfo_field('model name') or 'unknown'}, bf16 units: "
            f"{', '.join(cpu_bf16_features()) or 'none'}")
