"""Policy tools: load a policy file as data (relay checkpoints, ONNX exports, ML-Agents files),
export it to ONNX, verify its precision, fingerprint and latency."""
