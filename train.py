"""Train or evaluate MobileNetV1: python train.py [--config X.yaml] [flags] [DIR] [key.sub=value ...]"""
import sys

from mobilenet.errors import exit_code


def main(argv=None, ending=False):
    """train.py's exit code; ``ending``: the process ends after it (late stop signals are ignored)."""
    resolved = {}
    if hasattr(sys.stdout, "reconfigure"):  # file names are bytes on Linux: print them as they are,
        sys.stdout.reconfigure(errors="surrogateescape")  # whatever the terminal's encoding

    def train():  # imports inside: a Ctrl-C while torch loads is one line too
        from mobilenet.cli import build_parser, config_from_args
        args = build_parser(__doc__).parse_intermixed_args(argv)
        resolved["cfg"] = cfg = config_from_args(args)
        from mobilenet.engine import run  # the engine loads after the config is known to be valid
        run(cfg, resume=args.resume, evaluate_only=args.evaluate, start_over=args.start_over)
    return exit_code(train, run_dir=lambda: resolved["cfg"]["output"] if resolved else None, ending=ending)


if __name__ == "__main__":
    code = main(ending=True)  # the run is over and has said how: a late signal must not change that
    from mobilenet.watchdog import kill_loader_workers
    kill_loader_workers()  # a stuck one would hold Python's exit forever
    from mobilenet.distributed import exit_process
    exit_process(code)
