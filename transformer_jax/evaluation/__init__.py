"""How good translations are: BLEU and chrF with their signatures, and paired significance tests."""
