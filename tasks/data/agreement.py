"""Long-range subject-verb agreement: an embedded, word-level artificial English.

Every sentence comes from a small probabilistic grammar (``max_depth`` bounds the nesting)::

    sentence   -> subject main-verb complement "."
    subject    -> noun-phrase(depth=0)
    noun-phrase(d) -> "the" [adjective] noun [modifiers if d < max_depth]
    modifiers  -> [preposition noun-phrase(d+1)] ["that" noun-phrase(d+1) verb]
    main-verb  -> "is"/"are" | transitive verb ("sees"/"see", ...)
    complement -> adjective | locative-preposition noun-phrase(max_depth)  (after "is"/"are")
                | noun-phrase(max_depth)                                 (after a transitive verb)

Each optional part is drawn with a fixed probability (``P_*`` below); each noun is singular
or plural with equal probability. A verb agrees in number with the
HEAD noun of its own subject: the main verb with the first noun of the sentence, the verb
of a relative clause with the head of that clause's subject. The nouns in between are
attractors when their number differs from the head's, e.g. (head "keys", attractors
"cabinet" and "man")::

    the keys to the old cabinet that the man sees are on the table .

so predicting "are" over "is" needs the sentence structure, not the nearest noun.

The lexicon is fixed, so ``agreement_vocab()`` (and the vocabulary size) is known without
generating anything. ``generate_agreement_corpus`` returns train and held-out token streams
and agreement probes: held-out sentences with the position of the main verb and its two
number forms, scored as ``logit[correct] > logit[wrong]`` at the preceding position. The
held-out stream and probes are the validation ones, or (``held_out="tuning"``) those of the
tuning split: drawn alike from streams of their own, never trained on and never reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

SPECIALS = ("<pad>", ".")
PAD_ID = 0
SEPARATOR_ID = 1

DETERMINER = "the"
COMPLEMENTIZER = "that"
# The lexicon is kept small on purpose: a 4-layer, d_model=128 GPT must learn the number of
# every noun and verb form within a few hundred steps; with twice as many nouns and verbs it
# stays at chance on agreement for 400 steps.
# (singular, plural)
NOUNS = (
    ("key", "keys"),
    ("door", "doors"),
    ("cabinet", "cabinets"),
    ("table", "tables"),
    ("man", "men"),
    ("woman", "women"),
    ("child", "children"),
    ("dog", "dogs"),
    ("cat", "cats"),
    ("box", "boxes"),
    ("book", "books"),
    ("window", "windows"),
    ("chair", "chairs"),
    ("lamp", "lamps"),
    ("bird", "birds"),
    ("car", "cars"),
)
# (singular, plural) = (third person -s form, bare form)
TRANSITIVE_VERBS = (
    ("sees", "see"),
    ("likes", "like"),
    ("finds", "find"),
    ("moves", "move"),
    ("holds", "hold"),
    ("watches", "watch"),
)
COPULA = ("is", "are")
ADJECTIVES = ("red", "old", "small", "big", "green", "heavy", "new", "blue", "broken", "quiet")
MODIFIER_PREPOSITIONS = ("near", "to", "behind", "beside")
LOCATIVE_PREPOSITIONS = ("on", "in", "under", "near", "behind")

SINGULAR, PLURAL = 0, 1

# grammar probabilities
P_ADJECTIVE = 0.2  # an adjective before a noun
P_PREPOSITIONAL_PHRASE = 0.5  # a noun phrase (below max_depth) takes a prepositional phrase
P_RELATIVE_CLAUSE = 0.35  # ... and/or a relative clause
P_COPULA = 0.5  # main verb is "is"/"are" rather than a transitive verb
P_ADJECTIVE_COMPLEMENT = 0.5  # "is red" rather than "is on the table"


def agreement_vocab() -> list[str]:
    """The fixed vocabulary; a word's index is its token id (``<pad>`` = 0, ``"."`` = 1)."""
    words = [*SPECIALS, DETERMINER, COMPLEMENTIZER]
    words += [form for pair in NOUNS + TRANSITIVE_VERBS for form in pair]
    words += [*COPULA, *ADJECTIVES, *MODIFIER_PREPOSITIONS, *LOCATIVE_PREPOSITIONS]
    return list(dict.fromkeys(words))  # "near" and "behind" serve both preposition roles


_VOCAB = agreement_vocab()
_ID = {word: i for i, word in enumerate(_VOCAB)}
_NOUN_IDS = [(_ID[s], _ID[p]) for s, p in NOUNS]
_VERB_IDS = [(_ID[s], _ID[p]) for s, p in TRANSITIVE_VERBS]
_COPULA_IDS = (_ID[COPULA[SINGULAR]], _ID[COPULA[PLURAL]])
_ADJECTIVE_IDS = [_ID[w] for w in ADJECTIVES]
_MODIFIER_IDS = [_ID[w] for w in MODIFIER_PREPOSITIONS]
_LOCATIVE_IDS = [_ID[w] for w in LOCATIVE_PREPOSITIONS]
_THE, _THAT = _ID[DETERMINER], _ID[COMPLEMENTIZER]


@dataclass(frozen=True, eq=False)
class AgreementCorpus:
    vocab: list[str]
    train: np.ndarray  # int64 stream: sentences, each followed by "."
    val: np.ndarray  # the held-out stream (validation or tuning): same format, independent random stream
    probes: np.ndarray  # int64 (N, L): "." + sentence + ".", right-padded with <pad>
    probe_position: np.ndarray  # int64 (N,): column of the main verb, predicted from column - 1
    probe_correct: np.ndarray  # int64 (N,): the agreeing verb form
    probe_wrong: np.ndarray  # int64 (N,): the same verb in the other number
    probe_attractor: np.ndarray  # bool (N,): an opposite-number noun stands between head and verb

    def decode(self, ids) -> str:
        return " ".join(self.vocab[i] for i in np.asarray(ids).tolist() if i != PAD_ID)


class _Draws:
    """Uniform numbers drawn from a numpy generator in blocks (one draw per Python call is slow)."""

    def __init__(self, rng: np.random.Generator, block: int = 1 << 16):
        self._rng = rng
        self._block = block
        self._values: list[float] = []
        self._next = 0

    def uniform(self) -> float:
        if self._next == len(self._values):
            self._values = self._rng.random(self._block).tolist()
            self._next = 0
        self._next += 1
        return self._values[self._next - 1]

    def chance(self, p: float) -> bool:
        return self.uniform() < p

    def pick(self, options):
        return options[int(self.uniform() * len(options))]


@dataclass
class _Sentence:
    tokens: list[int]
    verb_index: int  # index of the main verb in ``tokens``
    head_number: int
    verb_forms: tuple[int, int]  # (singular, plural) ids of the main verb
    attractor: bool


def _noun_phrase(
    draws: _Draws, depth: int, max_depth: int, tokens: list[int], numbers: list[int], number: int | None = None
) -> None:
    """Append a noun phrase to ``tokens`` and the number of each of its nouns to ``numbers``."""
    tokens.append(_THE)
    if draws.chance(P_ADJECTIVE):
        tokens.append(draws.pick(_ADJECTIVE_IDS))
    if number is None:
        number = PLURAL if draws.chance(0.5) else SINGULAR
    tokens.append(draws.pick(_NOUN_IDS)[number])
    numbers.append(number)
    if depth >= max_depth:
        return
    if draws.chance(P_PREPOSITIONAL_PHRASE):
        tokens.append(draws.pick(_MODIFIER_IDS))
        _noun_phrase(draws, depth + 1, max_depth, tokens, numbers)
    if draws.chance(P_RELATIVE_CLAUSE):
        tokens.append(_THAT)
        clause_head = len(numbers)
        _noun_phrase(draws, depth + 1, max_depth, tokens, numbers)
        tokens.append(draws.pick(_VERB_IDS)[numbers[clause_head]])


def _sentence(draws: _Draws, max_depth: int, head_number: int | None = None) -> _Sentence:
    tokens: list[int] = []
    numbers: list[int] = []
    _noun_phrase(draws, 0, max_depth, tokens, numbers, head_number)
    head_number = numbers[0]
    verb_index = len(tokens)
    if draws.chance(P_COPULA):
        verb_forms = _COPULA_IDS
        tokens.append(verb_forms[head_number])
        if draws.chance(P_ADJECTIVE_COMPLEMENT):
            tokens.append(draws.pick(_ADJECTIVE_IDS))
        else:
            tokens.append(draws.pick(_LOCATIVE_IDS))
            _noun_phrase(draws, max_depth, max_depth, tokens, [])
    else:
        verb_forms = draws.pick(_VERB_IDS)
        tokens.append(verb_forms[head_number])
        _noun_phrase(draws, max_depth, max_depth, tokens, [])
    tokens.append(SEPARATOR_ID)
    attractor = any(n != head_number for n in numbers[1:])
    return _Sentence(tokens, verb_index, head_number, verb_forms, attractor)


def _stream(draws: _Draws, n_tokens: int, max_depth: int) -> tuple[np.ndarray, set[tuple[int, ...]]]:
    """Whole sentences until at least ``n_tokens`` tokens; also returns the set of sentences."""
    tokens: list[int] = []
    sentences: set[tuple[int, ...]] = set()
    while len(tokens) < n_tokens:
        sentence = _sentence(draws, max_depth).tokens
        sentences.add(tuple(sentence))
        tokens += sentence
    return np.asarray(tokens, dtype=np.int64), sentences


def _probes(draws: _Draws, n_probes: int, max_depth: int, probe_len: int, excluded: set):
    """Probe ``i`` has a plural head if ``i`` is odd and an attractor if ``i % 4 < 2``; no probe
    sentence is in ``excluded`` (the training sentences, and for the tuning probes the validation ones)."""
    rows = np.full((n_probes, probe_len), PAD_ID, dtype=np.int64)
    position = np.zeros(n_probes, dtype=np.int64)
    correct = np.zeros(n_probes, dtype=np.int64)
    wrong = np.zeros(n_probes, dtype=np.int64)
    attractor = np.zeros(n_probes, dtype=bool)
    for i in range(n_probes):
        head_number, want_attractor = i % 2, i % 4 < 2
        while True:
            sentence = _sentence(draws, max_depth, head_number)
            fits = len(sentence.tokens) + 1 <= probe_len  # +1 for the leading "."
            if fits and sentence.attractor == want_attractor and tuple(sentence.tokens) not in excluded:
                break
        row = [SEPARATOR_ID, *sentence.tokens]
        rows[i, : len(row)] = row
        position[i] = sentence.verb_index + 1
        correct[i] = sentence.verb_forms[sentence.head_number]
        wrong[i] = sentence.verb_forms[1 - sentence.head_number]
        attractor[i] = sentence.attractor
    return rows, position, correct, wrong, attractor


def _probe_sentence(row: list[int]) -> tuple[int, ...]:
    """The sentence of a probe row (``"." + sentence + "."`` and padding): its tokens, final "." included."""
    return tuple(row[1 : row.index(SEPARATOR_ID, 1) + 1])


def generate_agreement_corpus(
    *,
    n_train_tokens: int,
    n_val_tokens: int,
    n_probes: int,
    max_depth: int = 2,
    probe_len: int = 64,
    seed: int = 0,
    held_out: Literal["validation", "tuning"] = "validation",
) -> AgreementCorpus:
    """Train/held-out streams of whole sentences (each at least the requested length, ending in ".")
    and ``n_probes`` held-out probe sentences: half with a singular head, half plural, at least
    half with an attractor, none appearing verbatim in the train stream.

    Five independent generators spawned from ``seed`` draw the training stream, the validation
    stream, the validation probes, the tuning stream and the tuning probes; ``held_out`` picks
    which held-out pair the corpus holds. The training stream is the same for both, and the
    tuning probes avoid the validation probes' sentences too.
    """
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1 (a subject needs room for an attractor), got {max_depth}")
    shortest_attractor_probe = 9  # ". the key near the doors is red ." (subject + verb + complement)
    if probe_len < shortest_attractor_probe:
        raise ValueError(f"probe_len must be >= {shortest_attractor_probe}, got {probe_len}")
    if held_out not in ("validation", "tuning"):
        raise ValueError(f"held_out must be 'validation' or 'tuning', got {held_out!r}")
    # spawn(5)'s first three generators are spawn(3)'s: a fixed seed draws the data it drew before tuning existed
    train_rng, val_rng, probe_rng, tuning_rng, tuning_probe_rng = np.random.default_rng(seed).spawn(5)
    train, train_sentences = _stream(_Draws(train_rng), n_train_tokens, max_depth)
    probes = _probes(_Draws(probe_rng), n_probes, max_depth, probe_len, train_sentences)
    if held_out == "validation":
        val, _ = _stream(_Draws(val_rng), n_val_tokens, max_depth)
    else:
        val, _ = _stream(_Draws(tuning_rng), n_val_tokens, max_depth)
        validation_probes = {_probe_sentence(row) for row in probes[0].tolist()}
        probes = _probes(_Draws(tuning_probe_rng), n_probes, max_depth, probe_len, train_sentences | validation_probes)
    return AgreementCorpus(list(_VOCAB), train, val, *probes)


def unigram_entropy(stream: np.ndarray, vocab_size: int) -> float:
    """Entropy in nats of the empirical unigram distribution of ``stream``."""
    counts = np.bincount(np.asarray(stream).ravel(), minlength=vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
