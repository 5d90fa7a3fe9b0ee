"""Trains the bundled demo under every amp level x optimizer and prints img/s and top-1.

python scripts/amp_table.py [--dtype bfloat16] [--levels O0 O1 O2] [train.py flags/overrides...]
Runs one after another in fresh processes (never in parallel: they would share the cores).
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--levels", nargs="+", default=["O0", "O1", "O2"])
    p.add_argument("--optimizers", nargs="+", default=["standard", "fused"])
    args, extra = p.parse_known_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for level in args.levels:
            for impl in args.optimizers:
                out = Path(tmp) / f"{level}-{impl}"
                cmd = [sys.executable, str(ROOT / "train.py"), "--optimizer", impl, "--amp", level,
                       f"amp.dtype={args.dtype}", "--output", str(out), *extra]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                summary = json.loads((out / "summary.json").read_text())
                rows.append((level, impl, summary["img_per_s"], summary["top1"]))
                print(f"{level} {impl:8} {summary['img_per_s']:8.1f} img/s  top-1 {summary['top1']:.2f}",
                      file=sys.stderr, flush=True)
    print(f"| amp ({args.dtype}) | optimizer | img/s | val top-1 |\n|---|---|---|---|")
    for level, impl, speed, top1 in rows:
        print(f"| {level} | {impl} | {speed:.1f} | {top1:.2f} |")


if __name__ == "__main__":
    main()
