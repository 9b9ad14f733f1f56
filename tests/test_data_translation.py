import random

import numpy as np
import pytest

from tasks.data.synthetic_translation import (
    BOS_ID,
    EOS_ID,
    FEMININE,
    MASCULINE,
    MAX_SENTENCE_WORDS,
    PAD_ID,
    SPECIALS,
    TARGET_ADJECTIVE_ENDINGS,
    TARGET_DETERMINERS,
    TARGET_LEXICON,
    NounPhrase,
    Sentence,
    generate_parallel_corpus,
    sample_sentence,
    translation_vocab,
)


@pytest.fixture(scope="module")
def corpus():
    return generate_parallel_corpus(n_train=2000, n_val=300, seed=3)


# Hand-checked pairs: "dog", "king", "bird" are masculine; "cat", "house", "queen", "tree",
# "farmer" feminine. Adjective stems: big "rav", small "rik", red "tom", young "rek", dark "fas".
HAND_CHECKED = [
    (
        Sentence(
            NounPhrase("dog", adjectives=("big",)),
            "see",
            NounPhrase("cat", plural=True, definite=False, adjectives=("small",), numeral="two"),
            place=("near", NounPhrase("house")),
        ),
        "the big dog sees two small cats near the house",
        # the.M dog big.M | the.F house near | a.F.PL cat.PL small.F.PL two | see.SG
        "el fozug ravo ta kubuv guku nai vuriben rike edu kodut",
    ),
    (
        Sentence(
            NounPhrase("queen", plural=True, adjectives=("young", "dark")),
            "follow",
            NounPhrase("king", definite=False),
        ),
        "the young dark queens follow a king",
        # the.F.PL queen.PL young.F.PL dark.F.PL | a.M king | follow.PL
        "tai kulaven reke fase on rozak pesint",
    ),
    (
        Sentence(
            NounPhrase("tree", definite=False, adjectives=("red",)),
            "help",
            NounPhrase("farmer", plural=True, definite=False, adjectives=("big",)),
            place=("under", NounPhrase("bird", plural=True, numeral="three")),
        ),
        "a red tree helps some big farmers under the three birds",
        # a.F tree red.F | the.M.PL bird.PL three under | a.F.PL farmer.PL big.F.PL | help.SG
        "na zebuk toma eli lesoken ide pibe nai risupen rave morut",
    ),
]


def test_vocab_is_fixed_with_specials_first():
    vocab = translation_vocab()
    assert vocab[: len(SPECIALS)] == ["<pad>", "<bos>", "<eos>"]
    assert (PAD_ID, BOS_ID, EOS_ID) == (0, 1, 2)
    assert len(set(vocab)) == len(vocab)
    assert translation_vocab() == vocab
    for seed in (0, 1):
        assert generate_parallel_corpus(n_train=5, n_val=5, seed=seed).vocab == vocab


def test_generation_is_deterministic_and_seeds_differ():
    a = generate_parallel_corpus(n_train=200, n_val=50, seed=0)
    b = generate_parallel_corpus(n_train=200, n_val=50, seed=0)
    c = generate_parallel_corpus(n_train=200, n_val=50, seed=1)
    for split in ("train", "val"):
        assert np.array_equal(getattr(a, split).src, getattr(b, split).src)
        assert np.array_equal(getattr(a, split).tgt, getattr(b, split).tgt)
        assert getattr(a, split).tgt_text == getattr(b, split).tgt_text
        assert getattr(a, split).src_text != getattr(c, split).src_text
    assert a.train.src_text != a.val.src_text[: len(a.train.src_text)]


@pytest.mark.parametrize("split_name", ["train", "val"])
def test_array_layout(corpus, split_name):
    split = getattr(corpus, split_name)
    word_id = {word: i for i, word in enumerate(corpus.vocab)}
    n = len(split.src_text)
    assert split.src.dtype == np.int64 and split.tgt.dtype == np.int64
    assert split.src.shape == (n, 24) and split.tgt.shape == (n, 24) and len(split.tgt_text) == n
    for src_row, tgt_row, src_text, tgt_text in zip(split.src, split.tgt, split.src_text, split.tgt_text):
        src_ids = [word_id[w] for w in src_text.split()] + [EOS_ID]
        tgt_ids = [BOS_ID] + [word_id[w] for w in tgt_text.split()] + [EOS_ID]
        assert src_row.tolist() == src_ids + [PAD_ID] * (24 - len(src_ids))
        assert tgt_row.tolist() == tgt_ids + [PAD_ID] * (24 - len(tgt_ids))


def test_decode_round_trips_and_stops_at_eos(corpus):
    for split in (corpus.train, corpus.val):
        for i in range(50):
            assert corpus.decode(split.tgt[i]) == split.tgt_text[i]
            assert corpus.decode(split.src[i]) == split.src_text[i]
    # a greedy-decoder row: no BOS, EOS fill after the end
    row = corpus.train.tgt[0, 1:].copy()
    row[row == PAD_ID] = EOS_ID
    assert corpus.decode(row) == corpus.train.tgt_text[0]
    assert corpus.decode([BOS_ID, EOS_ID, corpus.train.tgt[0, 1]]) == ""


def test_sentence_lengths(corpus):
    for text in corpus.train.src_text + corpus.train.tgt_text:
        assert 5 <= len(text.split()) <= MAX_SENTENCE_WORDS
    with pytest.raises(ValueError, match="max_len"):
        generate_parallel_corpus(n_train=1, n_val=1, max_len=MAX_SENTENCE_WORDS)


def test_languages_share_no_word(corpus):
    source_words = {w for text in corpus.train.src_text for w in text.split()}
    target_words = {w for text in corpus.train.tgt_text for w in text.split()}
    assert source_words and target_words and not source_words & target_words


@pytest.mark.parametrize(("sentence", "source", "target"), HAND_CHECKED)
def test_hand_checked_translations(sentence, source, target):
    assert " ".join(sentence.source_words()) == source
    assert " ".join(sentence.target_words()) == target


def test_reordering_verb_last_and_adjectives_after_noun():
    sentence, source, target = HAND_CHECKED[0]
    source_words, target_words = source.split(), target.split()
    assert source_words.index("sees") == 3  # SVO
    assert target_words[-1] == "kodut"  # SOV: "sees" is last
    assert source_words.index("big") < source_words.index("dog")
    assert target_words.index("fozug") < target_words.index("ravo")  # dog big.M
    assert target_words.index("guku") < target_words.index("vuriben")  # the place precedes the object
    rng = random.Random(0)
    for _ in range(300):
        sentence = sample_sentence(rng)
        verb = TARGET_LEXICON.verbs[sentence.verb]
        assert sentence.target_words()[-1] in (verb.singular, verb.plural)
        for phrase in (sentence.subject, sentence.object):
            words = phrase.target_words()
            noun = TARGET_LEXICON.nouns[phrase.noun]
            assert words[1] == (noun.plural if phrase.plural else noun.singular)
            adjective_stems = [TARGET_LEXICON.adjectives[a].stem for a in phrase.adjectives]
            assert [w[:-1] for w in words[2 : 2 + len(adjective_stems)]] == adjective_stems


def test_agreement_follows_gender_and_number():
    genders = {noun.gender for noun in TARGET_LEXICON.nouns.values()}
    assert genders == {MASCULINE, FEMININE}
    rng = random.Random(1)
    seen = set()
    for _ in range(500):
        sentence = sample_sentence(rng)
        verb = TARGET_LEXICON.verbs[sentence.verb]
        assert sentence.target_words()[-1] == (verb.plural if sentence.subject.plural else verb.singular)
        for phrase in (sentence.subject, sentence.object):
            gender = TARGET_LEXICON.nouns[phrase.noun].gender
            words = phrase.target_words()
            assert words[0] == TARGET_DETERMINERS[phrase.definite, gender, phrase.plural]
            for adjective in words[2 : 2 + len(phrase.adjectives)]:
                assert adjective[-1] == TARGET_ADJECTIVE_ENDINGS[gender, phrase.plural]
            seen.add((gender, phrase.plural))
    assert len(seen) == 4
    # minimal pairs: same source adjective and determiner, the noun alone changes the target forms
    masculine = NounPhrase("dog", adjectives=("big",))  # el fozug ravo
    feminine = NounPhrase("cat", adjectives=("big",))  # ta vurib rava
    feminine_plural = NounPhrase("cat", plural=True, adjectives=("big",))  # tai vuriben rave
    assert masculine.target_words() == ["el", "fozug", "ravo"]
    assert feminine.target_words() == ["ta", "vurib", "rava"]
    assert feminine_plural.target_words() == ["tai", "vuriben", "rave"]
    singular = Sentence(NounPhrase("dog"), "like", NounPhrase("cat"))
    plural = Sentence(NounPhrase("dog", plural=True), "like", NounPhrase("cat"))
    assert singular.target_words()[-1] == "ruret" and plural.target_words()[-1] == "rurent"


def test_val_is_disjoint_from_train():
    # without deduplication, 3 of these validation sentences would also be training sentences
    corpus = generate_parallel_corpus(n_train=3000, n_val=1000, seed=5)
    assert not set(corpus.val.src_text) & set(corpus.train.src_text)
    assert len(corpus.val.src_text) == 1000
