"""Retrieval: two-tower training with corrected in-batch and sampled negatives."""

from reckeras.retrieval.frequency import FrequencyEstimator

__all__ = ["FrequencyEstimator"]
