"""Input side: sources of sentence pairs, the SentencePiece tokenizer, grain pipelines."""
