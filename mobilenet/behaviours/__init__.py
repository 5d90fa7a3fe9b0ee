"""The behaviours a run can do without, each a module of its own entered at the run's four named
points (mobilenet/engine.py enters them, in the list's order):

  at_start(r)                     the run is built and resumed, before anything is validated or
                                  trained; a behaviour may return a summary, which ends the run
  at_resume(r, path, checkpoint)  a checkpoint the core takes weights from only (not a training
                                  checkpoint of this app's): returns notes if it takes the rest
  at_log(r, interval)             after each log interval's progress line
  at_epoch_end(r, results)        after an epoch's validation, before its checkpoint is written

``behaviours_for(cfg)`` builds the list from the resolved config alone, so it is the same on
every rank (the ranks' configs are compared first); a behaviour that talks to the other ranks
runs on each. A forker removes one by removing its module and its line below.
"""
from mobilenet.behaviours.advice import Advice
from mobilenet.behaviours.lost_summary import LostSummary
from mobilenet.behaviours.rank_agreement import RankAgreement
from mobilenet.behaviours.unreadable_classes import UnreadableClasses
from mobilenet.behaviours.modelzoo import ModelZooContinuation


def behaviours_for(cfg):
    """The run's behaviours, in the order they are entered."""
    several = cfg["derived"]["world_size"] > 1
    return [LostSummary(), ModelZooContinuation(), *([RankAgreement()] if several else []), UnreadableClasses(),
            Advice(cfg)]
