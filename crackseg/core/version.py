"""The crackseg release: model files, exports and label files record it."""

__version__ = "0.1.0"
