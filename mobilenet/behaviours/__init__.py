"""The behaviours a run can do without, each a module entered at the named points it defines:
at_start(r) (built and resumed), at_log(r, interval), at_epoch_end(r, results) (before the save).
Its tests are tests/test_behaviour_<module>.py and nothing else imports it (tests/test_tables.py
checks): delete the module, its line below and that file to remove it.
"""
from mobilenet.behaviours.advice import Advice
from mobilenet.behaviours.lost_summary import LostSummary
from mobilenet.behaviours.rank_agreement import RankAgreement
from mobilenet.behaviours.unreadable_classes import UnreadableClasses


def behaviours_for():
    """The run's behaviours, in the order they are entered; each reads the run at its points."""
    return [LostSummary(), RankAgreement(), UnreadableClasses(), Advice()]
