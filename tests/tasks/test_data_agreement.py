import math

import numpy as np
import pytest

from blockbench.tasks.data.agreement import (
    COPULA,
    NOUNS,
    SPECIALS,
    TRANSITIVE_VERBS,
    AgreementCorpus,
    agreement_vocab,
    generate_agreement_corpus,
    unigram_entropy,
)

VOCAB = agreement_vocab()
NOUN_NUMBER = {form: number for pair in NOUNS for number, form in enumerate(pair)}
VERB_NUMBER = {form: number for pair in (COPULA, *TRANSITIVE_VERBS) for number, form in enumerate(pair)}
VERB_PAIRS = {frozenset(pair) for pair in (COPULA, *TRANSITIVE_VERBS)}
ARRAY_FIELDS = ("train", "val", "probes", "probe_position", "probe_correct", "probe_wrong", "probe_attractor")


def small_corpus(seed: int = 0, **kwargs) -> AgreementCorpus:
    sizes = {"n_train_tokens": 5000, "n_val_tokens": 1000, "n_probes": 64}
    return generate_agreement_corpus(**{**sizes, **kwargs}, seed=seed)


@pytest.fixture(scope="module")
def corpus() -> AgreementCorpus:
    return small_corpus()


def words(corpus: AgreementCorpus, ids) -> list[str]:
    return corpus.decode(ids).split()


def subject_numbers(sentence: list[str], verb_index: int) -> tuple[int, list[int]]:
    """Number of the head noun (the first noun) and of the other nouns before ``verb_index``."""
    numbers = [NOUN_NUMBER[w] for w in sentence[:verb_index] if w in NOUN_NUMBER]
    return numbers[0], numbers[1:]


def has_attractor(sentence: list[str], verb_index: int) -> bool:
    head, others = subject_numbers(sentence, verb_index)
    return any(n != head for n in others)


# ---------------------------------------------------------------- vocabulary


def test_vocab_is_fixed_with_specials_first():
    assert agreement_vocab() == VOCAB
    assert tuple(VOCAB[:2]) == SPECIALS == ("<pad>", ".")
    assert len(VOCAB) == len(set(VOCAB)) == 67
    assert small_corpus().vocab == VOCAB


def test_vocab_holds_every_lexicon_form():
    for pair in (*NOUNS, *TRANSITIVE_VERBS, COPULA):
        assert pair[0] != pair[1]
        assert set(pair) <= set(VOCAB)
    assert not set(NOUN_NUMBER) & set(VERB_NUMBER)


# ---------------------------------------------------------------- determinism


def test_same_seed_gives_identical_arrays(corpus):
    again = small_corpus()
    for field in ARRAY_FIELDS:
        np.testing.assert_array_equal(getattr(corpus, field), getattr(again, field), err_msg=field)


def test_different_seeds_give_different_data(corpus):
    other = small_corpus(seed=1)
    for field in ("train", "val", "probes"):
        a, b = getattr(corpus, field), getattr(other, field)
        assert a.shape != b.shape or not np.array_equal(a, b), field


def test_train_and_val_come_from_independent_streams(corpus):
    n = min(len(corpus.train), len(corpus.val))
    assert not np.array_equal(corpus.train[:n], corpus.val[:n])


# ---------------------------------------------------------------- streams


@pytest.mark.parametrize("split, n_tokens", [("train", 5000), ("val", 1000)])
def test_stream_format(corpus, split, n_tokens):
    stream = getattr(corpus, split)
    assert stream.dtype == np.int64 and stream.ndim == 1
    assert len(stream) >= n_tokens
    assert stream.min() == 1 and stream.max() < len(VOCAB)  # no <pad>
    assert stream[-1] == 1
    separators = np.flatnonzero(stream == 1)
    starts = np.r_[0, separators[:-1] + 1]
    assert (separators - starts >= 4).all()  # "the NOUN VERB COMPLEMENT" at least
    assert (stream[starts] == VOCAB.index("the")).all()


def test_streams_have_grammatical_agreement(corpus):
    for sentence in corpus.decode(corpus.train).split(" . ")[:200]:
        tokens = sentence.split()
        first_verb = next(i for i, w in enumerate(tokens) if w in VERB_NUMBER)
        if "that" not in tokens[:first_verb]:  # otherwise the first verb is a relative clause's
            head, _ = subject_numbers(tokens, first_verb)
            assert VERB_NUMBER[tokens[first_verb]] == head, sentence


# ---------------------------------------------------------------- probes


def test_probe_shapes_and_layout(corpus):
    n = 64
    assert corpus.probes.shape == (n, 64) and corpus.probes.dtype == np.int64
    for field in ("probe_position", "probe_correct", "probe_wrong"):
        assert getattr(corpus, field).shape == (n,) and getattr(corpus, field).dtype == np.int64
    assert corpus.probe_attractor.shape == (n,) and corpus.probe_attractor.dtype == bool
    assert (corpus.probes[:, 0] == 1).all()
    for row in corpus.probes:
        length = int((row != 0).sum())
        assert (row[:length] != 0).all() and (row[length:] == 0).all()  # right-padded
        assert row[length - 1] == 1 and (row[1 : length - 1] != 1).all()  # exactly one sentence


def test_probe_verb_forms(corpus):
    rows = np.arange(len(corpus.probes))
    np.testing.assert_array_equal(corpus.probes[rows, corpus.probe_position], corpus.probe_correct)
    assert (corpus.probe_correct != corpus.probe_wrong).all()
    assert (corpus.probe_position >= 3).all()  # ". the NOUN" precede the verb
    for correct, wrong in zip(corpus.probe_correct, corpus.probe_wrong, strict=True):
        assert frozenset((VOCAB[correct], VOCAB[wrong])) in VERB_PAIRS


def test_probe_verb_agrees_with_head_noun(corpus):
    for row, position, correct in zip(corpus.probes, corpus.probe_position, corpus.probe_correct, strict=True):
        sentence = words(corpus, row)
        head, _ = subject_numbers(sentence, position)
        assert VERB_NUMBER[VOCAB[correct]] == head, " ".join(sentence)


def test_probe_balance(corpus):
    plural = np.array([VERB_NUMBER[VOCAB[c]] for c in corpus.probe_correct])
    assert plural.sum() == len(plural) // 2
    assert corpus.probe_attractor.sum() >= len(plural) // 2
    assert (~corpus.probe_attractor).any()


@pytest.mark.parametrize(
    "sentence, main_verb, expected",
    [
        ("the keys to the cabinet are on the table", "are", True),
        ("the keys to the cabinet near the doors are red", "are", True),  # though the nearest noun agrees
        ("the key that the men see is red", "is", True),
        ("the key near the door that the man sees is red", "is", False),
        ("the keys near the doors are near the door", "are", False),  # the complement is not in between
        ("the dogs behind the dog near the birds hold the box", "hold", True),
    ],
)
def test_attractor_rule_on_hand_checked_sentences(sentence, main_verb, expected):
    tokens = sentence.split()
    assert has_attractor(tokens, tokens.index(main_verb)) == expected


def test_probe_attractor_flags(corpus):
    for row, position, flag in zip(corpus.probes, corpus.probe_position, corpus.probe_attractor, strict=True):
        sentence = words(corpus, row)
        assert has_attractor(sentence, position) == flag, " ".join(sentence)


def test_probes_are_held_out(corpus):
    train_sentences = set(corpus.decode(corpus.train).split(" . "))
    for row in corpus.probes:
        assert corpus.decode(row)[2:-2] not in train_sentences


def test_probes_fit_a_short_probe_len():
    corpus = small_corpus(n_probes=16, probe_len=12)
    assert corpus.probes.shape == (16, 12)
    assert ((corpus.probes == 1).sum(axis=1) == 2).all()  # both separators fit


@pytest.mark.parametrize("bad", [{"max_depth": 0}, {"probe_len": 8}])
def test_rejects_settings_without_room_for_an_attractor(bad):
    with pytest.raises(ValueError):
        small_corpus(**bad)


def test_decode_skips_padding(corpus):
    ids = [1, VOCAB.index("the"), VOCAB.index("keys"), VOCAB.index("are"), VOCAB.index("red"), 1, 0, 0]
    assert corpus.decode(ids) == ". the keys are red ."
    assert corpus.decode(np.asarray(ids)) == ". the keys are red ."


# ---------------------------------------------------------------- unigram entropy


def test_unigram_entropy_hand_computed():
    assert unigram_entropy(np.array([2, 2, 3, 3]), 10) == pytest.approx(math.log(2))
    assert unigram_entropy(np.array([1, 2, 3, 4]), 5) == pytest.approx(math.log(4))
    assert unigram_entropy(np.array([5, 5, 5]), 6) == pytest.approx(0.0)
    p = np.array([3, 1]) / 4  # stream [a, a, a, b]
    assert unigram_entropy(np.array([7, 7, 7, 8]), 9) == pytest.approx(-(p * np.log(p)).sum())


def test_unigram_entropy_of_the_corpus_is_below_uniform(corpus):
    entropy = unigram_entropy(corpus.train, len(VOCAB))
    assert 0 < entropy < math.log(len(VOCAB) - 1)
