"""kvconv's version, on the ground floor: any room may read it without importing the package's face (which opens
runs, and so stands above everything).

    >>> from kvconv.version import __version__
    >>> __version__
    '0.1.0'
"""

__version__ = "0.1.0"  # as pyproject.toml's [project] version
