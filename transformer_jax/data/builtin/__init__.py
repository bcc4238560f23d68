"""A built-in English -> German translation corpus, generated deterministically from a seed.

It is the default data of the project's main job: no download, small vocabulary (a few hundred
words), learnable by a 1-5M parameter Transformer on a CPU in minutes, yet it needs what attention
gives. The German is grammatical (few rules, applied exactly) and every English source has exactly
one German translation. Task families, mixed by `families._FAMILY_PERCENT`:

* numbers: "342" or "three hundred and forty-two" -> "dreihundertzweiundvierzig" (units before
  tens, compound words);
* dates: "on Monday, the 3rd of May 2021" -> "am Montag, dem 3. Mai 2021", spelled ordinals with
  case endings ("on the third of May" -> "am dritten Mai");
* simple clauses: statements, yes/no questions (verb first) and fronted adverbials (verb second:
  "Today the man sees the dog." -> "Heute sieht der Mann den Hund."), modal verbs sending the
  infinitive to the end, article/adjective agreement in gender, number and case;
* complement and adverbial clauses: "dass"/"weil"/"wenn"/"während" send the verb to the end, a
  fronted subordinate clause inverts the main clause;
* relative clauses: the relative pronoun takes gender and number from its head and case from its
  role in the clause ("der Hund, den der Mann sieht, schläft");
* pronoun reference: English "it" becomes er/sie/es (ihn/ihm/ihr...) according to the grammatical
  gender of a noun several words back.

Sentences are capitalised and end in "." or "?"; number and date phrases are fragments. About 360
English word types; sources have 9-10 words on average, 5-40 for over 90% of them, at most ~35.
`build_corpus` draws fixed, distinct, disjoint train/validation/test splits from a seed.
Determinism: only `random.Random(seed)` draws, over tuples in a fixed order (never sets or str
hashes), so a seed gives the same corpus on every machine and process.

Modules: `numbers` (numbers, ordinals, dates), `lexicon` (words and their specs), `grammar`
(rendering: agreement, word order, pronouns), `families` (random choices and the task families,
`generate_pair`), `splits` (`build_corpus`).
"""

from transformer_jax.data.builtin.families import FAMILIES, generate_pair
from transformer_jax.data.builtin.grammar import (
    Clause, Phrase, noun_phrase, personal_pronoun, relative_pronoun, sentence, with_relative)
from transformer_jax.data.builtin.lexicon import (
    ACC, ADJECTIVE, DAT, NOM, NOUN, VERB, german_present)
from transformer_jax.data.builtin.numbers import (
    date_phrase, english_number, english_ordinal, german_number, german_ordinal_stem)
from transformer_jax.data.builtin.splits import SPLITS, build_corpus

__all__ = [
    'ACC', 'ADJECTIVE', 'DAT', 'FAMILIES', 'NOM', 'NOUN', 'SPLITS', 'VERB', 'Clause', 'Phrase',
    'build_corpus', 'date_phrase', 'english_number', 'english_ordinal', 'generate_pair',
    'german_number', 'german_ordinal_stem', 'german_present', 'noun_phrase', 'personal_pronoun',
    'relative_pronoun', 'sentence', 'with_relative',
]
