"""Errors a user can cause. The CLI prints them as one line and exits with code 2."""


class ApdError(Exception):
    """Base class for user-facing errors (bad config, missing data, bad artifact, divergence)."""


class ConfigError(ApdError):
    """A pipeline file that cannot be read or does not validate."""


class DataError(ApdError):
    """A dataset that is missing or malformed."""


class ArtifactError(ApdError):
    """An artifact that is missing, corrupt, or does not match the pipeline."""


class DivergenceError(ApdError):
    """A sampler or trainer whose loss or parameters became NaN or infinite."""
