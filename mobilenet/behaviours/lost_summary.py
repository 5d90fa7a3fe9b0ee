"""A finished run whose summary.json is missing or damaged (the run ended while it wrote it):
its final checkpoint is validated again to write it, at the start of the resume that finds it
(the core then says the run is complete)."""
from pathlib import Path

from mobilenet.distributed import from_rank0
from mobilenet.validation import accuracy_line, read_summary, validate, write_summary


class LostSummary:
    def at_start(self, r):
        if not r.state.finished or r.state.awaiting_validation:
            return
        path = Path(r.cfg["output"]) / "summary.json"
        if from_rank0(lambda: bool(read_summary(path, r.log.info))):
            return
        r.log.info(f"{path} is missing or unreadable: the final checkpoint is validated again to write it")
        results = validate(r)
        r.log.info(accuracy_line(results[""].top1, results[""].top5, results[""].note()))
        write_summary(r, results)
