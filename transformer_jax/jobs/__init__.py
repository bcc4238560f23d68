"""The jobs a main runs: the training loop with its reports and stop requests, and scoring a run."""
