"""Train or evaluate MobileNetV1: python train.py [--config X.yaml] [flags] [DIR] [key.sub=value ...]"""
import signal
import sys

from mobilenet.errors import STOP_SIGNALS, exit_code


def main(argv=None):
    resolved = {}

    def train():  # imports inside: a Ctrl-C while torch loads is one line too
        from mobilenet.cli import build_parser, config_from_args
        args = build_parser(__doc__).parse_intermixed_args(argv)
        resolved["cfg"] = cfg = config_from_args(args)
        from mobilenet.engine import run  # the engine loads after the config is known to be valid
        run(cfg, resume=args.resume, evaluate_only=args.evaluate, start_over=args.start_over)
    return exit_code(train, run_dir=lambda: resolved["cfg"]["output"] if resolved else None)


if __name__ == "__main__":
    code = main()
    for stop in STOP_SIGNALS:  # the run is over and has said how:
        signal.signal(stop, signal.SIG_IGN)  # a late signal must not turn its exit code into a kill
    from mobilenet.watchdog import kill_loader_workers
    kill_loader_workers()  # a stuck one would hold Python's exit forever
    sys.exit(code)
