"""Using a trained model: restoring its checkpoints, decoding (beam, greedy, sampling) and generating text."""
