"""The lost-summary behaviour (mobilenet/behaviours/lost_summary.py)."""
from test_checkpoints import run, two_epochs, two_epochs_trained  # noqa: F401 (fixtures)
import json
import pytest


@pytest.mark.parametrize("damage", ["missing", "cut short"])
def test_a_finished_run_without_its_summary_writes_it_again_on_resume(two_epochs, digits, capsys, damage):  # noqa: F811
    """Every ending that exits 0 leaves what a finished run leaves: a summary.json lost to a crash
    while it was written is written again from a validation of the final checkpoint."""
    summary = two_epochs / "summary.json"
    before = json.loads(summary.read_text())
    summary.unlink() if damage == "missing" else summary.write_text('{"top1": 9')
    capsys.readouterr()
    assert run(digits, two_epochs, "--epochs", "2", "train.keep_checkpoints=2", "--resume", "auto") == 0
    out = capsys.readouterr().out
    assert "summary.json is missing or unreadable: the final checkpoint is validated again" in out
    assert " * Prec@1" in out and "is complete: 2 of 2 epochs" in out
    after = json.loads(summary.read_text())
    assert (after["top1"], after["epochs"], after["global_step"]) == (before["top1"], 2, before["global_step"])
