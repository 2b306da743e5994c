"""PaPE and PaPE-RI (Koo Øhrstrøm et al. 2026): parabolic biases in extra q / k channels."""
