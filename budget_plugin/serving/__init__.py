"""Serving where CPU users serve: a fine-tuned model, at any dial setting, physically
cut and exported to ONNX (fp32, and dynamically quantized int8) with what the torch-free
predictor (budget_serve) needs beside it."""
