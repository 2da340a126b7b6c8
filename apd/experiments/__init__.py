"""The studies on a pipeline's artifacts, listed in :mod:`apd.experiments.studies`."""
