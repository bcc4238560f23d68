"""The paper's model: the Transformer and its language model, attention's implementations behind one call, the
loss, the layer layouts of its parameters, and ensembles of models."""
