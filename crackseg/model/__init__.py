"""model: networks, the model-file format, runtimes (torch / ONNX Runtime / OpenVINO), export, inference, processes.

May import crackseg.core.
"""
