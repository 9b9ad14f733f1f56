import hashlib
import random

import numpy as np
import pytest

from blockbench.tasks.data.synthetic_translation import (
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
    ParallelCorpus,
    ParallelSplit,
    Sentence,
    generate_parallel_corpus,
    sample_sentence,
    source_word_forms,
    translation_vocab,
    word_by_word_dictionary,
    word_by_word_translations,
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
    for src_row, tgt_row, src_text, tgt_text in zip(split.src, split.tgt, split.src_text, split.tgt_text, strict=True):
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


# the word-by-word baseline --------------------------------------------------------------------


def _split(src_text: list[str], tgt_text: list[str]) -> ParallelSplit:
    empty = np.zeros((len(src_text), 0), dtype=np.int64)  # the baseline reads only the texts
    return ParallelSplit(src=empty, tgt=empty, src_text=src_text, tgt_text=tgt_text)


def test_word_by_word_dictionary_takes_each_words_most_frequent_target_form():
    forms = source_word_forms()
    assert forms["the"] == ("el", "eli", "ta", "tai") and forms["a"] == ("on", "na") and forms["some"] == ("oni", "nai")
    assert forms["dog"] == ("fozug",) and forms["dogs"] == ("fozugen",)  # number is visible in the source word
    assert forms["sees"] == ("kodut",) and forms["see"] == ("kodunt",)
    assert forms["big"] == ("ravo", "ravi", "rava", "rave") and forms["near"] == ("guku",) and forms["two"] == ("edu",)
    assert forms["that"] == ("ke",)
    every_form = {form for word_forms in forms.values() for form in word_forms}
    assert every_form <= set(translation_vocab(relative_clauses=True))
    dictionary = word_by_word_dictionary(["ta vurib rava", "ta kubuv rava", "el fozug ravo kodut"])
    assert dictionary["the"] == "ta" and dictionary["big"] == "rava"  # 2 to 1 in these targets
    assert dictionary["a"] == "on"  # no "on" or "na" in the targets: the first form
    assert dictionary["dog"] == "fozug" and dictionary["sees"] == "kodut"


def test_word_by_word_baseline_on_hand_made_pairs_matches_sacrebleu():
    from sacrebleu import corpus_bleu

    from blockbench.tasks.translation import ParallelDataModule, TranslationTaskConfig

    train = _split(
        ["the big cat", "the big house", "the big dog sees"], ["ta vurib rava", "ta kubuv rava", "el fozug ravo kodut"]
    )
    val = _split(
        ["the big dog sees the cat", "the cat"],
        ["el fozug ravo ta vurib kodut", "ta vurib"],  # references (SOV, adjectives after the noun, agreement)
    )
    datamodule = ParallelDataModule(TranslationTaskConfig(), batch_size=2)
    datamodule.corpus = ParallelCorpus(vocab=translation_vocab(), train=train, val=val)
    # by hand, one word at a time in source order: the -> ta, big -> rava, dog -> fozug, sees -> kodut, cat -> vurib
    hypotheses = ["ta rava fozug kodut ta vurib", "ta vurib"]
    assert word_by_word_translations(datamodule.corpus) == hypotheses
    baselines = datamodule.baselines()
    assert baselines["bleu"] == pytest.approx(corpus_bleu(hypotheses, [val.tgt_text]).score)
    assert 0 < baselines["bleu"] < 100
    assert baselines["exact_match"] == 0.5  # the second sentence needs no reordering


def test_word_by_word_baseline_on_generated_data_is_informative(corpus):
    from sacrebleu import corpus_bleu

    hypotheses = word_by_word_translations(corpus)
    references = corpus.val.tgt_text
    assert corpus_bleu(corpus.val.src_text, [references]).score == 0  # copying the source: no shared word
    assert corpus_bleu(references, [references]).score == pytest.approx(100)
    bleu = corpus_bleu(hypotheses, [references]).score
    assert 0 < bleu < 100
    # every content word is right (the lexicon is known), but the word order is the source's
    single = {form for forms in source_word_forms().values() if len(forms) == 1 for form in forms}
    for hypothesis, reference, source in zip(hypotheses, references, corpus.val.src_text, strict=True):
        assert len(hypothesis.split()) == len(source.split())
        assert {w for w in hypothesis.split() if w in single} <= set(reference.split())
    assert sum(h == r for h, r in zip(hypotheses, references, strict=True)) == 0  # the verb is never last in SVO order


# relative clauses (max_depth > 0) ------------------------------------------------------------


def _digest(corpus: ParallelCorpus) -> str:
    arrays = (corpus.train.src, corpus.train.tgt, corpus.val.src, corpus.val.tgt)
    return hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()[:16]


def test_without_clauses_the_corpus_and_vocabulary_are_those_drawn_before_the_setting():
    """Digests of corpora drawn before relative clauses existed: the book's cells keep their data."""
    assert _digest(generate_parallel_corpus(n_train=2000, n_val=200, seed=5)) == "77baa02078177779"
    tuning = generate_parallel_corpus(n_train=2000, n_val=200, seed=5, held_out="tuning", max_depth=0)
    assert _digest(tuning) == "33c5f82b538a9e30" and len(tuning.vocab) == 111
    with_clauses = translation_vocab(relative_clauses=True)
    assert with_clauses[:111] == translation_vocab() and with_clauses[111:] == ["that", "ke"]


def test_hand_checked_nested_relative_clause():
    """The outer clause's verb waits for the whole inner clause and agrees with its own head."""
    # cats (F, plural) that see a house (F) that likes some dogs (M, plural) help the red houses
    inner = NounPhrase("house", definite=False, relative=("like", NounPhrase("dog", plural=True, definite=False)))
    subject = NounPhrase("cat", plural=True, definite=False, adjectives=("dark",), relative=("see", inner))
    sentence = Sentence(subject, "help", NounPhrase("house", plural=True, adjectives=("red",)))
    assert " ".join(sentence.source_words()) == (
        "some dark cats that see a house that likes some dogs help the red houses"
    )
    # a.F.PL cat.PL dark.F.PL ke | a.F house ke | a.M.PL dog.PL | like.SG | see.PL | the.F.PL house.PL red.F.PL help.PL
    assert " ".join(sentence.target_words()) == (
        "nai vuriben fase ke na kubuv ke oni fozugen ruret kodunt tai kubuven tome morunt"
    )


def _clause_verbs(phrase: NounPhrase) -> list[tuple[NounPhrase, list[str]]]:
    """Each noun phrase with a clause, with its target words, outermost first."""
    if phrase.relative is None:
        return []
    return [(phrase, phrase.target_words()), *_clause_verbs(phrase.relative[1])]


def test_clauses_nest_to_max_depth_and_each_verb_agrees_with_its_head():
    rng = random.Random(2)
    deepest = 0
    for _ in range(2000):
        sentence = sample_sentence(rng, max_depth=2)
        for phrase in (sentence.subject, sentence.object):
            nested = _clause_verbs(phrase)
            deepest = max(deepest, len(nested))
            for head, words in nested:
                verb = TARGET_LEXICON.verbs[head.relative[0]]
                assert words[-1] == (verb.plural if head.plural else verb.singular)
                assert words[len(head.target_words()) - len(head.relative[1].target_words()) - 2] == "ke"
    assert deepest == 2  # the setting reaches its depth, and never beyond


def test_pairs_longer_than_max_len_are_drawn_again():
    corpus = generate_parallel_corpus(n_train=3000, n_val=200, seed=1, max_len=30, max_depth=3)
    lengths = (corpus.train.tgt != PAD_ID).sum(axis=1)
    assert lengths.max() <= 30 and (corpus.train.src != PAD_ID).sum(axis=1).max() <= 30
    assert (lengths > 24).any()  # clauses make sentences longer than any without them
    assert corpus.vocab[-2:] == ["that", "ke"] and "ke" in " ".join(corpus.train.tgt_text)
    for row, text in zip(corpus.val.tgt[:50], corpus.val.tgt_text[:50], strict=True):
        assert corpus.decode(row) == text


def test_word_by_word_baseline_translates_the_clause_markers():
    corpus = generate_parallel_corpus(n_train=500, n_val=100, seed=4, max_len=40, max_depth=2)
    for hypothesis, source in zip(word_by_word_translations(corpus), corpus.val.src_text, strict=True):
        assert hypothesis.split().count("ke") == source.split().count("that")


def test_translation_config_sizes_the_vocabulary_by_the_setting():
    from blockbench.tasks.translation import TranslationTaskConfig

    assert TranslationTaskConfig().model_overrides()["vocab_size"] == 111
    assert TranslationTaskConfig(max_depth=2, max_len=40).model_overrides()["vocab_size"] == 113
