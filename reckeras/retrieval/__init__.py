"""Retrieval: two-tower training with corrected in-batch and sampled negatives."""

from reckeras.retrieval.cross_rank import gather_candidates
from reckeras.retrieval.frequency import FrequencyEstimator
from reckeras.retrieval.losses import (accidental_hits, bpr_loss, cosine_contrastive_loss,
                                       sampled_softmax_loss)
from reckeras.retrieval.negatives import NegativeSampler

__all__ = ["FrequencyEstimator", "NegativeSampler", "accidental_hits", "bpr_loss",
           "cosine_contrastive_loss", "gather_candidates", "sampled_softmax_loss"]
