"""Crackseg inside the tools people already use: CVAT auto-annotation and a Label Studio ML backend.

Imports labels, prediction, data and core; torch only once a model is loaded."""
