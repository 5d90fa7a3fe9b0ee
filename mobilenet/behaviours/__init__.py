"""The behaviours a run can do without, each a module of its own entered at the run's three named
points (mobilenet/engine.py's ``enter``, in the list's order); a behaviour defines the points it
uses:

  at_start(r)                 the run is built and resumed, before anything is validated or trained
  at_log(r, interval)         after each log interval's progress line
  at_epoch_end(r, results)    after an epoch's validation, before its checkpoint is written

``behaviours_for(cfg)`` builds the list from the resolved config alone: the same on every rank.
A behaviour's tests are tests/test_behaviour_<module>.py and nothing else imports it
(tests/test_tables.py checks): delete its module, its line below and that file to remove it.
"""
from mobilenet.behaviours.advice import Advice
from mobilenet.behaviours.lost_summary import LostSummary
from mobilenet.behaviours.rank_agreement import RankAgreement
from mobilenet.behaviours.unreadable_classes import UnreadableClasses


def behaviours_for(cfg):
    """The run's behaviours, in the order they are entered."""
    several = cfg["derived"]["world_size"] > 1
    return [LostSummary(), *([RankAgreement()] if several else []), UnreadableClasses(), Advice(cfg)]
