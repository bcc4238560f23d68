"""Training a model: the train state and pure steps, the optimizer and schedule, the one run builder, checkpoints,
and the metrics a step reports."""
