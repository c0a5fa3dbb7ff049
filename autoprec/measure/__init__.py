"""Judging a candidate: accuracy metrics and task decoders, timing, the isolated worker, layer-wise
diagnosis."""
