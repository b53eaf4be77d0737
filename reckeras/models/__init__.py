"""Model zoo: functions from FeatureColumns to uncompiled `rk.Model`s."""

from reckeras.models.bst import bst
from reckeras.models.dcn_v2 import dcn_v2
from reckeras.models.deepfm import deepfm
from reckeras.models.din import din
from reckeras.models.dlrm import dlrm

__all__ = ["bst", "dcn_v2", "deepfm", "din", "dlrm"]
