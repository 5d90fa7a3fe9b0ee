"""The benchmarks, one entry point: python scripts/bench.py NAME [options] [key.sub=value ...]

  optimizer   the optimizer step alone: loop, foreach, fused (and NpuFused* on npu); ms and ops
  ops         launches (aten ops) per training step, phase by phase, per implementation and amp level
  host-model  the host-bound model of the step against measured loop/fused step times
  amp         training img/s per amp level x optimizer (where bfloat16 pays)
  compile     training img/s with train.compile against eager
  accumulation  A forwards accumulated a step against plain steps of their batch, and one batch of A x b
  ema         the step with no EMA, the app's WeightEMA, torch's AveragedModel
  data        the input pipeline, one worker, against torchvision's
  feed        ImageNet-like JPEGs and their prepared set: cost by stage, feed by workers, training
  ranks       the epoch-end check that every rank holds the same state, against a step
  pipeline    end-to-end training against the same step fed from memory
  ceiling     the app's loop against plain loops on its DataLoader and on a static batch

`python scripts/bench.py NAME --help` lists a benchmark's options. Each runs its variants in one
process in interleaved rounds (benchmarks/harness.py) and prints a markdown table; --json FILE writes
its numbers. The code of each is scripts/benchmarks/NAME.py.
"""
import importlib.util
import sys
from pathlib import Path

import package  # noqa: F401  (the mobilenet package, or one line that says how to run this)

BENCHMARKS = Path(__file__).resolve().parent / "benchmarks"  # beside this script: benchmarks.harness imports


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    names = sorted(p.stem.replace("_", "-") for p in BENCHMARKS.glob("*.py") if p.stem != "harness")
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in names:
        print(f"error: no benchmark '{name}'; one of {', '.join(names)}", file=sys.stderr)
        return 2
    from mobilenet.errors import UsageError
    try:
        load(name).main(rest)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def load(name):
    """The module scripts/benchmarks/NAME.py (NAME with '-' for '_')."""
    path = BENCHMARKS / f"{name.replace('-', '_')}.py"
    spec = importlib.util.spec_from_file_location(f"benchmark_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.argv[0] = f"bench.py {name}"  # argparse's usage line
    return module


if __name__ == "__main__":
    sys.exit(main())
