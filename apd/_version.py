"""The package's version, kept in this one place: ``pyproject.toml`` reads it (``[tool.setuptools.dynamic]``),
``apd --version`` prints it and every manifest records it. A module of its own, importing nothing, so that
reading the version loads none of the pipeline."""

__version__ = "0.2.0"
