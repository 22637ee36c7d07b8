"""tokencredit inside other trainers: `trl` (GRPOTrainer subclass, token-weighted SFT) and `verl`
(the `mrtpo` advantage estimator and a verifier reward function). Each needs its own extra:
`pip install -e ".[trl]"` or `".[verl]"`."""
