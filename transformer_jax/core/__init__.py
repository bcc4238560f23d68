"""What every layer shares: reserved token ids, one-line errors, the readers and writers of user and run files,
the run directory's layout, and the safe points where a long job may stop."""
