"""Synthetic translation: an embedded parallel corpus between two small artificial languages.

Each pair comes from one abstract sentence (``Sentence``) realised in both languages, so the
reference translation is exact. The target language reorders words and marks agreement, so a
translator must attend to the right source words; copying the source scores zero BLEU because
the two languages share no word. The trivial baseline (``word_by_word_translations``) knows the
lexicon but neither the word order nor the agreement: it translates each source word alone into
its most frequent target form and keeps the source order.

Source, English-like, SVO, adjectives before the noun::

    sentence    -> noun-phrase verb noun-phrase [preposition noun-phrase]
    noun-phrase -> determiner [numeral] adjective{0,2} noun      (numerals only in plural)
    determiner  -> "the" | "a" (singular) | "some" (plural) | nothing (plural with a numeral)
    verb        -> "sees" after a singular subject, "see" after a plural one

Target, invented, SOV with postpositions, adjectives and numerals after the noun::

    sentence    -> subject [noun-phrase postposition] object verb
    noun-phrase -> determiner noun adjective{0,2} [numeral]

Every target noun has a fixed gender, masculine or feminine, drawn once for the lexicon and
visible neither in the source word nor in the target noun. The determiner agrees with the
noun's gender and number (and translates definiteness), the adjective ending with its gender
and number, the verb ending with the subject's number:

    ==========  =====  ======  ======  =======
    determiner  m sg   m pl    f sg    f pl
    ==========  =====  ======  ======  =======
    definite    el     eli     ta      tai
    indefinite  on     oni     na      nai
    adjective   -o     -i      -a      -e
    ==========  =====  ======  ======  =======

Plural nouns add "-en"; verbs end in "-t" after a singular subject and "-nt" after a plural
one. An aligned example (target glossed word by word)::

    source:  the big dog sees two small cats near the house
    target:  el     fozug  ravo   ta     kubuv  guku  nai     vuriben  rike        edu  kodut
    gloss:   the.M  dog    big.M  the.F  house  near  a.F.PL  cat.PL   small.F.PL  two  see.SG

Target content words are pseudo-words coined from consonant-vowel syllables by a random
generator with a fixed seed, so the shared vocabulary (``translation_vocab()``: specials,
source words, target words) is the same for every corpus seed. Sentences have 5 to 17 words.

Harder: relative clauses (``max_depth`` > 0, none by default). A noun phrase may then carry a
clause whose subject is its noun, nested up to ``max_depth`` deep. The source keeps the verb
next to "that"; the target closes the clause with the verb, after its object and everything
nested in it, and the verb agrees with the head noun's number::

    noun-phrase -> ... noun [that verb noun-phrase]       (source)
    noun-phrase -> ... [numeral] [ke noun-phrase verb]    (target)

    source:  some dark cats that see a house that likes some dogs help the red houses
    target:  nai vuriben fase ke na kubuv ke oni fozugen ruret kodunt tai kubuven tome morunt
    gloss:   a.F.PL cat.PL dark.F.PL that a.F house that a.M.PL dog.PL like.SG see.PL ...

So the verb of an outer clause waits for the whole inner clause: a dependency that grows with the
depth. Sentences longer than ``max_len`` are drawn again; "that" and "ke" join the vocabulary only
when clauses are on, so the default vocabulary and corpus are exactly those without the setting.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np

SPECIALS = ("<pad>", "<bos>", "<eos>")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

MASCULINE, FEMININE = "masculine", "feminine"

# ---------------------------------------------------------------------------------------------
# Source language: English-like, fixed word lists.
# ---------------------------------------------------------------------------------------------
SOURCE_DEFINITE = "the"
SOURCE_INDEFINITE_SINGULAR = "a"
SOURCE_INDEFINITE_PLURAL = "some"  # dropped when a numeral follows: "two dogs", "the two dogs"
# The lexicon is small on purpose: a 4+4-layer translator must learn it in a few hundred steps.
SOURCE_NOUNS = ("dog", "cat", "bird", "horse", "farmer", "teacher", "king", "queen", "tree", "house")
SOURCE_ADJECTIVES = ("big", "small", "red", "young", "dark")
SOURCE_VERBS = ("see", "like", "follow", "find", "help")  # bare (plural) forms; the singular adds "s"
SOURCE_PREPOSITIONS = ("near", "behind", "under")
SOURCE_NUMERALS = ("two", "three", "four")
SOURCE_RELATIVE = "that"  # opens a relative clause (only with max_depth > 0)


def _source_words() -> list[str]:
    words = [SOURCE_DEFINITE, SOURCE_INDEFINITE_SINGULAR, SOURCE_INDEFINITE_PLURAL]
    words += [form for noun in SOURCE_NOUNS for form in (noun, noun + "s")]
    words += SOURCE_ADJECTIVES
    words += [form for verb in SOURCE_VERBS for form in (verb + "s", verb)]
    words += [*SOURCE_PREPOSITIONS, *SOURCE_NUMERALS]
    return words


# ---------------------------------------------------------------------------------------------
# Target language: fixed function words, content words coined from syllables.
# ---------------------------------------------------------------------------------------------
TARGET_DETERMINERS = {  # (definite, gender, plural) -> determiner
    (True, MASCULINE, False): "el",
    (True, MASCULINE, True): "eli",
    (True, FEMININE, False): "ta",
    (True, FEMININE, True): "tai",
    (False, MASCULINE, False): "on",
    (False, MASCULINE, True): "oni",
    (False, FEMININE, False): "na",
    (False, FEMININE, True): "nai",
}
TARGET_ADJECTIVE_ENDINGS = {  # (gender, plural) -> suffix of the adjective stem
    (MASCULINE, False): "o",
    (MASCULINE, True): "i",
    (FEMININE, False): "a",
    (FEMININE, True): "e",
}
TARGET_NOUN_PLURAL_SUFFIX = "en"
TARGET_VERB_SINGULAR_SUFFIX = "t"
TARGET_VERB_PLURAL_SUFFIX = "nt"
TARGET_RELATIVE = "ke"  # opens a relative clause; two letters, so no coined word (4+ letters) is it

# The coined lexicon depends only on this seed, never on the corpus seed: changing it renames
# every target word (and so changes the meaning of every trained checkpoint's vocabulary).
_LEXICON_SEED = 20240
_CONSONANTS = "bdfgklmprstvz"
_VOWELS = "aeiou"

# corpus grammar probabilities
P_PLURAL = 0.4  # a noun phrase is plural
P_NUMERAL = 0.5  # a plural noun phrase has a numeral
P_DEFINITE = 0.5  # a noun phrase is definite
ADJECTIVE_COUNT_WEIGHTS = (0.4, 0.4, 0.2)  # a noun phrase has 0, 1 or 2 (distinct) adjectives
P_PLACE = 0.5  # the sentence ends with a prepositional phrase
P_RELATIVE = 0.4  # with max_depth > 0: a noun phrase above the deepest level carries a relative clause

MAX_ADJECTIVES = len(ADJECTIVE_COUNT_WEIGHTS) - 1
# three noun phrases of determiner + numeral + adjectives + noun, a verb and a preposition
MAX_SENTENCE_WORDS = 3 * (3 + MAX_ADJECTIVES) + 2


@dataclass(frozen=True)
class TargetNoun:
    singular: str
    plural: str
    gender: str


@dataclass(frozen=True)
class TargetAdjective:
    stem: str

    def form(self, gender: str, plural: bool) -> str:
        return self.stem + TARGET_ADJECTIVE_ENDINGS[gender, plural]


@dataclass(frozen=True)
class TargetVerb:
    singular: str
    plural: str


@dataclass(frozen=True)
class TargetLexicon:
    """Target words, keyed by the source lemma they translate."""

    nouns: dict[str, TargetNoun]
    adjectives: dict[str, TargetAdjective]
    verbs: dict[str, TargetVerb]
    postpositions: dict[str, str]  # source preposition -> target postposition
    numerals: dict[str, str]


def _coin_target_lexicon() -> TargetLexicon:
    """Pseudo-words from consonant-vowel syllables, drawn from a fixed seed, all distinct."""
    rng = random.Random(_LEXICON_SEED)
    taken = set(_source_words()) | set(TARGET_DETERMINERS.values())

    def coin(pattern: str, suffixes: tuple[str, ...]) -> str:
        """A stem of shape ``pattern`` (C = consonant, V = vowel) whose suffixed forms are new words."""
        while True:
            stem = "".join(rng.choice(_CONSONANTS if c == "C" else _VOWELS) for c in pattern)
            forms = {stem + suffix for suffix in suffixes}
            if taken.isdisjoint(forms):
                taken.update(forms)
                return stem

    genders = [MASCULINE, FEMININE] * (len(SOURCE_NOUNS) // 2)
    rng.shuffle(genders)
    nouns = {}
    for lemma, gender in zip(SOURCE_NOUNS, genders, strict=True):
        stem = coin("CVCVC", ("", TARGET_NOUN_PLURAL_SUFFIX))
        nouns[lemma] = TargetNoun(stem, stem + TARGET_NOUN_PLURAL_SUFFIX, gender)
    adjective_endings = tuple(TARGET_ADJECTIVE_ENDINGS.values())
    adjectives = {lemma: TargetAdjective(coin("CVC", adjective_endings)) for lemma in SOURCE_ADJECTIVES}
    verbs = {}
    for lemma in SOURCE_VERBS:
        stem = coin("CVCV", (TARGET_VERB_SINGULAR_SUFFIX, TARGET_VERB_PLURAL_SUFFIX))
        verbs[lemma] = TargetVerb(stem + TARGET_VERB_SINGULAR_SUFFIX, stem + TARGET_VERB_PLURAL_SUFFIX)
    postpositions = {lemma: coin("CVCV", ("",)) for lemma in SOURCE_PREPOSITIONS}
    numerals = {lemma: coin("VCV", ("",)) for lemma in SOURCE_NUMERALS}
    return TargetLexicon(nouns, adjectives, verbs, postpositions, numerals)


def _target_words(lexicon: TargetLexicon) -> list[str]:
    words = list(TARGET_DETERMINERS.values())
    words += [form for noun in lexicon.nouns.values() for form in (noun.singular, noun.plural)]
    words += [
        adjective.form(gender, plural)
        for adjective in lexicon.adjectives.values()
        for gender, plural in TARGET_ADJECTIVE_ENDINGS
    ]
    words += [form for verb in lexicon.verbs.values() for form in (verb.singular, verb.plural)]
    words += [*lexicon.postpositions.values(), *lexicon.numerals.values()]
    return words


TARGET_LEXICON = _coin_target_lexicon()
_VOCAB = (*SPECIALS, *_source_words(), *_target_words(TARGET_LEXICON))
_RELATIVE_WORDS = (SOURCE_RELATIVE, TARGET_RELATIVE)  # appended last, so every other id stays
_WORD_ID = {word: i for i, word in enumerate((*_VOCAB, *_RELATIVE_WORDS))}


def translation_vocab(relative_clauses: bool = False) -> list[str]:
    """The fixed shared vocabulary (specials, source words, target words; then the two relative
    clause markers when ``relative_clauses``); index = token id."""
    return [*_VOCAB, *_RELATIVE_WORDS] if relative_clauses else list(_VOCAB)


# ---------------------------------------------------------------------------------------------
# Abstract sentences, realised in both languages.
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NounPhrase:
    noun: str  # source lemma, e.g. "dog"
    plural: bool = False
    definite: bool = True
    adjectives: tuple[str, ...] = ()  # source lemmas, in source order
    numeral: str | None = None  # source numeral; only in plural noun phrases
    relative: tuple[str, NounPhrase] | None = None  # (verb lemma, its object): "that <verb> <object>"

    def __post_init__(self):
        if self.numeral is not None and not self.plural:
            raise ValueError(f"numeral {self.numeral!r} in a singular noun phrase")

    def source_words(self) -> list[str]:
        if self.definite:
            words = [SOURCE_DEFINITE]
        elif not self.plural:
            words = [SOURCE_INDEFINITE_SINGULAR]
        elif self.numeral is None:
            words = [SOURCE_INDEFINITE_PLURAL]
        else:
            words = []
        if self.numeral is not None:
            words.append(self.numeral)
        words = [*words, *self.adjectives, self.noun + "s" if self.plural else self.noun]
        if self.relative is not None:
            verb, obj = self.relative
            words += [SOURCE_RELATIVE, verb if self.plural else verb + "s", *obj.source_words()]
        return words

    def target_words(self) -> list[str]:
        noun = TARGET_LEXICON.nouns[self.noun]
        words = [TARGET_DETERMINERS[self.definite, noun.gender, self.plural]]
        words.append(noun.plural if self.plural else noun.singular)
        words += [TARGET_LEXICON.adjectives[a].form(noun.gender, self.plural) for a in self.adjectives]
        if self.numeral is not None:
            words.append(TARGET_LEXICON.numerals[self.numeral])
        if self.relative is not None:
            lemma, obj = self.relative
            verb = TARGET_LEXICON.verbs[lemma]
            words += [TARGET_RELATIVE, *obj.target_words(), verb.plural if self.plural else verb.singular]
        return words


@dataclass(frozen=True)
class Sentence:
    subject: NounPhrase
    verb: str  # source lemma (bare form), e.g. "see"
    object: NounPhrase
    place: tuple[str, NounPhrase] | None = None  # (source preposition, its noun phrase)

    def source_words(self) -> list[str]:
        """Subject, verb, object, optional prepositional phrase (SVO)."""
        verb = self.verb if self.subject.plural else self.verb + "s"
        words = [*self.subject.source_words(), verb, *self.object.source_words()]
        if self.place is not None:
            preposition, noun_phrase = self.place
            words += [preposition, *noun_phrase.source_words()]
        return words

    def target_words(self) -> list[str]:
        """Subject, optional postpositional phrase, object, verb (SOV)."""
        words = self.subject.target_words()
        if self.place is not None:
            preposition, noun_phrase = self.place
            words += [*noun_phrase.target_words(), TARGET_LEXICON.postpositions[preposition]]
        words += self.object.target_words()
        verb = TARGET_LEXICON.verbs[self.verb]
        words.append(verb.plural if self.subject.plural else verb.singular)
        return words


def _sample_noun_phrase(rng: random.Random, depth: int) -> NounPhrase:
    """A noun phrase that may nest relative clauses ``depth`` deep (0: none, and no draw for them)."""
    plural = rng.random() < P_PLURAL
    n_adjectives = rng.choices(range(len(ADJECTIVE_COUNT_WEIGHTS)), ADJECTIVE_COUNT_WEIGHTS)[0]
    noun_phrase = NounPhrase(
        noun=rng.choice(SOURCE_NOUNS),
        plural=plural,
        definite=rng.random() < P_DEFINITE,
        adjectives=tuple(rng.sample(SOURCE_ADJECTIVES, n_adjectives)),
        numeral=rng.choice(SOURCE_NUMERALS) if plural and rng.random() < P_NUMERAL else None,
    )
    if depth > 0 and rng.random() < P_RELATIVE:
        relative = (rng.choice(SOURCE_VERBS), _sample_noun_phrase(rng, depth - 1))
        noun_phrase = dataclasses.replace(noun_phrase, relative=relative)
    return noun_phrase


def sample_sentence(rng: random.Random, max_depth: int = 0) -> Sentence:
    """One abstract sentence of the corpus grammar (both realisations follow from it), its noun
    phrases nesting relative clauses up to ``max_depth`` deep."""
    subject = _sample_noun_phrase(rng, max_depth)
    verb = rng.choice(SOURCE_VERBS)
    obj = _sample_noun_phrase(rng, max_depth)
    place = (rng.choice(SOURCE_PREPOSITIONS), _sample_noun_phrase(rng, max_depth)) if rng.random() < P_PLACE else None
    return Sentence(subject, verb, obj, place)


# ---------------------------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class ParallelSplit:
    src: np.ndarray  # int64 (N, S): source ids, EOS, right-padded with PAD (no BOS)
    tgt: np.ndarray  # int64 (N, T): BOS, target ids, EOS, right-padded with PAD
    src_text: list[str]  # source sentences, space-joined words
    tgt_text: list[str]  # reference translations, space-joined words


@dataclass(frozen=True, eq=False)
class ParallelCorpus:
    vocab: list[str]
    train: ParallelSplit
    val: ParallelSplit  # the held-out pairs: the validation split, or the tuning split (``held_out``)

    def decode(self, ids) -> str:
        """The words of ``ids`` up to the first EOS, without PAD and BOS, space-joined."""
        words = []
        for token in np.asarray(ids).tolist():
            if token == EOS_ID:
                break
            if token not in (PAD_ID, BOS_ID):
                words.append(self.vocab[token])
        return " ".join(words)


def _encode(sentences: list[list[str]], width: int, *, with_bos: bool) -> np.ndarray:
    ids = np.full((len(sentences), width), PAD_ID, dtype=np.int64)
    for row, words in enumerate(sentences):
        prefix = [BOS_ID] if with_bos else []
        tokens = prefix + [_WORD_ID[w] for w in words] + [EOS_ID]
        ids[row, : len(tokens)] = tokens
    return ids


def _sample_split(rng: random.Random, n: int, width: int, excluded_sources: set[str], max_depth: int) -> ParallelSplit:
    """``n`` sentence pairs whose source sentence is not in ``excluded_sources`` and whose target
    (the longer side: every noun phrase has its determiner there) fits ``width`` with BOS and EOS."""
    sources, targets = [], []
    while len(sources) < n:
        sentence = sample_sentence(rng, max_depth)
        source, target = sentence.source_words(), sentence.target_words()
        if " ".join(source) not in excluded_sources and len(target) + 2 <= width:
            sources.append(source)
            targets.append(target)
    return ParallelSplit(
        src=_encode(sources, width, with_bos=False),
        tgt=_encode(targets, width, with_bos=True),
        src_text=[" ".join(words) for words in sources],
        tgt_text=[" ".join(words) for words in targets],
    )


# ---------------------------------------------------------------------------------------------
# Word-by-word translation: the trivial baseline.
# ---------------------------------------------------------------------------------------------
def source_word_forms() -> dict[str, tuple[str, ...]]:
    """Every source word with the target forms the lexicon can translate it into, out of context:
    a noun or verb form has one (its number is visible in the source word), a determiner or an
    adjective one per gender (and, for "the", number) of the noun it belongs to."""
    determiners = {
        SOURCE_DEFINITE: [TARGET_DETERMINERS[True, g, p] for g in (MASCULINE, FEMININE) for p in (False, True)],
        SOURCE_INDEFINITE_SINGULAR: [TARGET_DETERMINERS[False, g, False] for g in (MASCULINE, FEMININE)],
        SOURCE_INDEFINITE_PLURAL: [TARGET_DETERMINERS[False, g, True] for g in (MASCULINE, FEMININE)],
    }
    forms = {word: tuple(targets) for word, targets in determiners.items()}
    for lemma, noun in TARGET_LEXICON.nouns.items():
        forms[lemma], forms[lemma + "s"] = (noun.singular,), (noun.plural,)
    for lemma, adjective in TARGET_LEXICON.adjectives.items():
        forms[lemma] = tuple(adjective.form(g, p) for g, p in TARGET_ADJECTIVE_ENDINGS)
    for lemma, verb in TARGET_LEXICON.verbs.items():
        forms[lemma + "s"], forms[lemma] = (verb.singular,), (verb.plural,)
    forms.update({lemma: (word,) for lemma, word in TARGET_LEXICON.postpositions.items()})
    forms.update({lemma: (word,) for lemma, word in TARGET_LEXICON.numerals.items()})
    forms[SOURCE_RELATIVE] = (TARGET_RELATIVE,)
    return forms


def word_by_word_dictionary(train_targets: Iterable[str]) -> dict[str, str]:
    """Each source word -> the one of its target forms (``source_word_forms``) that is most frequent
    in the training target sentences (ties: the first in lexicon order)."""
    counts = Counter(word for sentence in train_targets for word in sentence.split())
    return {word: max(forms, key=lambda form: counts[form]) for word, forms in source_word_forms().items()}


def translate_word_by_word(source: str, dictionary: dict[str, str]) -> str:
    """``source`` translated one word at a time with ``dictionary``, in the source's word order."""
    return " ".join(dictionary[word] for word in source.split())


def word_by_word_translations(corpus: ParallelCorpus) -> list[str]:
    """The validation sources translated word by word with the dictionary of the training targets:
    every content word right (the lexicon is known), but SVO order kept (the target is SOV with
    adjectives and numerals after the noun) and determiners and adjectives in their most frequent
    gender and number instead of the noun's. A model that beats it has learned more than a lexicon."""
    dictionary = word_by_word_dictionary(corpus.train.tgt_text)
    return [translate_word_by_word(source, dictionary) for source in corpus.val.src_text]


def generate_parallel_corpus(
    *,
    n_train: int,
    n_val: int,
    max_len: int = 24,
    seed: int = 0,
    held_out: Literal["validation", "tuning"] = "validation",
    max_depth: int = 0,
) -> ParallelCorpus:
    """Train and held-out sentence pairs from independent random streams of ``seed``; no held-out
    source sentence occurs in train. Both arrays are ``max_len`` columns wide.

    The held-out pairs are the ``n_val`` validation pairs, or with ``held_out="tuning"`` as many
    tuning pairs: drawn from a stream of their own, their sources in neither the training nor the
    validation pairs, so tuning never sees what is reported. The training pairs are the same for both.
    With ``max_depth`` > 0 noun phrases nest relative clauses that deep; a pair too long for
    ``max_len`` is drawn again (without clauses no pair is: ``max_len`` fits the longest).
    """
    longest = MAX_SENTENCE_WORDS + 2  # the target row with BOS and EOS
    if max_len < longest:
        raise ValueError(f"max_len={max_len} is too short: a sentence pair needs up to {longest} tokens")
    if held_out not in ("validation", "tuning"):
        raise ValueError(f"held_out must be 'validation' or 'tuning', got {held_out!r}")
    if max_depth < 0:
        raise ValueError(f"max_depth must be at least 0, got {max_depth}")

    def split(stream: str, n: int, excluded: set[str]) -> ParallelSplit:
        return _sample_split(random.Random(f"{seed}/{stream}"), n, max_len, excluded, max_depth)

    train = split("train", n_train, set())
    val = split("val", n_val, set(train.src_text))
    if held_out == "tuning":
        val = split("tuning", n_val, set(train.src_text) | set(val.src_text))
    return ParallelCorpus(vocab=translation_vocab(relative_clauses=max_depth > 0), train=train, val=val)
