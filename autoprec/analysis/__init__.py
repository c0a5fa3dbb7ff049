"""What a model and its data are: units, inputs, the data split, calibration ranges, FP32 reference
outputs."""
