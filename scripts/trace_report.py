"""Where a training step's time goes, read from a profiler trace (train.profile=true):
python scripts/trace_report.py RUN_DIR/profile [--json FILE]

Per phase of the step (the ranges train.profile marks: data, forward, loss, backward, unscale,
optimizer, zero_grad, ema; "rest" is the loop's own time between them): host milliseconds,
kernel launches, and milliseconds of device work those launches queued. Then, per step: the
device's busy share of the step's wall time (its idle share is what host overhead costs), host
waits for the device (synchronize calls and synchronous copies), copies by direction, and the
dtype casts and layout changes dispatched.
"""
import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

PHASES = ("data", "forward", "loss", "backward", "unscale", "optimizer", "zero_grad", "ema")
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCHES = ("LaunchKernel", "MemcpyAsync", "MemsetAsync", "LaunchCooperativeKernel", "GraphLaunch")
CASTS = ("aten::_to_copy", "aten::to")
LAYOUT = ("aten::contiguous", "aten::clone")


def load(path):
    """The events of the newest trace in ``path`` (a folder or a *.pt.trace.json file)."""
    path = Path(path)
    if path.is_dir():
        traces = sorted(path.glob("*.pt.trace.json*"), key=lambda p: p.stat().st_mtime)
        if not traces:
            raise SystemExit(f"error: no *.pt.trace.json in {path}; run with train.profile=true")
        path = traces[-1]
    if path.suffix == ".gz":
        import gzip
        return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return json.loads(path.read_text())["traceEvents"]


def is_host_wait(name):
    return "Synchronize" in name or name in ("cudaMemcpy", "aclrtMemcpy")


def inside(event, span):
    return span["ts"] <= event["ts"] <= span["ts"] + span["dur"]


def report(events):
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    steps = [e for e in spans if e["name"].startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation"]
    if not steps:
        raise SystemExit("error: the trace has no ProfilerStep ranges")
    host = [e for e in spans if e.get("cat") not in DEVICE_WORK and e.get("cat") != "gpu_user_annotation"
            and any(inside(e, s) for s in steps)]  # the profiled steps' host events only
    phases = [e for e in host if e["name"] in PHASES]
    runtime = [e for e in host if e.get("cat") in ("cuda_runtime", "cuda_driver", "npu_runtime")]
    device = [e for e in spans if e.get("cat") in DEVICE_WORK]
    device_by_launch = defaultdict(float)
    for e in device:
        device_by_launch[e.get("args", {}).get("correlation")] += e["dur"]
    n = len(steps)
    table = {name: {"host_ms": 0.0, "launches": 0, "device_ms": 0.0} for name in (*PHASES, "rest")}
    for e in phases:
        table[e["name"]]["host_ms"] += e["dur"] / 1000 / n
    for e in runtime:
        phase = next((p["name"] for p in phases if p.get("tid") == e.get("tid") and inside(e, p)), "rest")
        if any(key in e["name"] for key in LAUNCHES):
            table[phase]["launches"] += 1
        table[phase]["device_ms"] += device_by_launch.get(e.get("args", {}).get("correlation"), 0.0) / 1000
    step_ms = sum(s["dur"] for s in steps) / 1000 / n
    table["rest"]["host_ms"] = step_ms - sum(row["host_ms"] for name, row in table.items() if name != "rest")
    for row in table.values():
        row["launches"] /= n
        row["device_ms"] /= n
    window = (min(s["ts"] for s in steps), max(s["ts"] + s["dur"] for s in steps))
    busy = union_ms(device, window)
    waits = [e for e in runtime if is_host_wait(e["name"])]
    copies = defaultdict(lambda: [0, 0.0])
    for e in device:
        if e.get("cat") == "gpu_memcpy" and window[0] <= e["ts"] <= window[1]:
            copies[e["name"]][0] += 1
            copies[e["name"]][1] += e["dur"] / 1000
    ops = [e for e in host if e.get("cat") == "cpu_op"]
    return {"steps": n, "step_ms": step_ms, "device_busy_share": busy / (window[1] - window[0]) * 1000,
            "phases": table,
            "host_waits_per_step": len(waits) / n, "host_wait_ms_per_step": sum(e["dur"] for e in waits) / 1000 / n,
            "host_wait_calls": sorted({e["name"] for e in waits}),
            "copies_per_step": {k: {"count": c / n, "ms": ms / n} for k, (c, ms) in copies.items()},
            "casts_per_step": sum(e["name"] in CASTS for e in ops) / n,
            "layout_changes_per_step": sum(e["name"] in LAYOUT for e in ops) / n}


def union_ms(events, window):
    """Milliseconds of ``window`` covered by at least one of ``events`` (device work overlaps)."""
    intervals = sorted((max(e["ts"], window[0]), min(e["ts"] + e["dur"], window[1])) for e in events)
    total, end = 0.0, window[0]
    for start, stop in intervals:
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total / 1000


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="a run's profile/ folder or a *.pt.trace.json(.gz) file")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    result = report(load(args.trace))
    print(f"{result['steps']} profiled steps, {result['step_ms']:.2f} ms each; device busy "
          f"{result['device_busy_share']:.0%} of the step; host waits for the device "
          f"{result['host_waits_per_step']:.1f} per step ({result['host_wait_ms_per_step']:.2f} ms: "
          f"{', '.join(result['host_wait_calls']) or 'none'}); casts {result['casts_per_step']:.0f}, "
          f"layout changes {result['layout_changes_per_step']:.0f} per step")
    print("| phase | host ms/step | launches/step | device ms/step queued |\n|---|---|---|---|")
    for name, row in result["phases"].items():
        print(f"| {name} | {row['host_ms']:.2f} | {row['launches']:.0f} | {row['device_ms']:.2f} |")
    for name, copy in result["copies_per_step"].items():
        print(f"copies {name}: {copy['count']:.1f} per step, {copy['ms']:.2f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    sys.exit(main() and 0)
