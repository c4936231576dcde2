"""The one NumPy search shared by the PyTorch and ONNX Runtime engines, over the ``StepModel`` interface."""

from aiayn.search.beam import Hypothesis, beam_search, beam_search_nbest, length_penalty_of
from aiayn.search.greedy import greedy_search, max_lengths
from aiayn.search.output import Output, mean_log_prob
from aiayn.search.step import StepModel

__all__ = [
    "Hypothesis",
    "Output",
    "StepModel",
    "beam_search",
    "beam_search_nbest",
    "length_penalty_of",
    "greedy_search",
    "max_lengths",
    "mean_log_prob",
]
