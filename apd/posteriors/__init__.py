"""Every method the evaluation compares, one file each, on one interface (:mod:`apd.posteriors.base`)."""

from apd.posteriors.base import Members, Posterior
from apd.posteriors.generated import APDGenerator
from apd.posteriors.mcdropout import MCDropout
from apd.posteriors.mixture import GaussianMixture
from apd.posteriors.point import PointEstimate
from apd.posteriors.sgld import SGLDSamples

__all__ = ["APDGenerator", "GaussianMixture", "MCDropout", "Members", "PointEstimate", "Posterior", "SGLDSamples"]
