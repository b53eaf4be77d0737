"""Model zoo: functions from FeatureColumns to uncompiled `rk.Model`s."""

from reckeras.models.bst import bst
from reckeras.models.dcn_v2 import dcn_v2
from reckeras.models.deepfm import deepfm
from reckeras.models.din import din
from reckeras.models.dlrm import dlrm
from reckeras.models.esmm import esmm
from reckeras.models.mmoe import mmoe
from reckeras.models.two_tower import two_tower

__all__ = ["bst", "dcn_v2", "deepfm", "din", "dlrm", "esmm", "mmoe", "two_tower"]
