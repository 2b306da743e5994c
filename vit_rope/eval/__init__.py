"""What users run on a trained model: the evaluation harness and its reports, the diagnostics and the ONNX export."""
