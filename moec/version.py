"""The version of moec, readable by every layer without importing the package face."""

__version__ = "0.2.0"
