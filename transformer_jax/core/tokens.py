"""Reserved token ids, defined once for the tokenizer, the model, the loss and decoding."""

PAD_ID = 0  # padding; also marks "no token" in masks (id > 0 means a real token)
EOS_ID = 1  # appended to every source and target sentence
BOS_ID = 2  # first decoder input (targets shifted right start with it)
UNK_ID = 3  # SentencePiece's unknown piece
NUM_RESERVED = 4
