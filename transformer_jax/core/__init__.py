"""What every layer shares: reserved token ids, one-line errors, the readers and writers of user and run files,
and the run directory's layout."""
