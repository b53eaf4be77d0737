"""Model zoo: functions from FeatureColumns to uncompiled ``rk.Model``s."""

from reckeras.models.dlrm import dlrm

__all__ = ["dlrm"]
