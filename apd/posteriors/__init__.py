"""Every method the evaluation compares, one file each, on one interface (:mod:`apd.posteriors.base`)."""

from apd.posteriors.base import Members, Posterior
from apd.posteriors.ensemble import DeepEnsemble
from apd.posteriors.generated import APDGenerator
from apd.posteriors.kept import FixedEnsemble, KeptSamples
from apd.posteriors.laplace import LaplacePosterior
from apd.posteriors.mcdropout import MCDropout
from apd.posteriors.mixture import GaussianMixture
from apd.posteriors.point import PointEstimate
from apd.posteriors.sgld import SGLDSamples
from apd.posteriors.swag import SWAGPosterior

__all__ = ["APDGenerator", "DeepEnsemble", "FixedEnsemble", "GaussianMixture", "KeptSamples", "LaplacePosterior",
           "MCDropout", "Members", "PointEstimate", "Posterior", "SGLDSamples", "SWAGPosterior"]
