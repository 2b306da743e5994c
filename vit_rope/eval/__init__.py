"""What users run on a trained model: the multi-resolution evaluation harness and its reports, the diagnostics of
learned frequencies and attention, and the ONNX export; models are loaded for all three by ``loading``."""
