"""Pure ETA models for training jobs: log parsing, curves, history MLP, online blend."""

from services.estimator.model.features import JobFeatures
from services.estimator.model.history import HistoryPredictor, HistoryPrior
from services.estimator.model.mllog import MetricSpec, RegexMetricParser, parse_mllog_line
from services.estimator.model.online import Estimate, OnlineEstimator

__all__ = [
    "Estimate",
    "HistoryPredictor",
    "HistoryPrior",
    "JobFeatures",
    "MetricSpec",
    "OnlineEstimator",
    "RegexMetricParser",
    "parse_mllog_line",
]
