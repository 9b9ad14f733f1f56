"""The LM's entropy floor (``data.agreement_floor``) against brute force on a tiny grammar.

The tiny grammar is the task's own sampler (``data.agreement._sentence``) over a one-noun,
one-verb lexicon: every run of the sampler is enumerated by scripting its random draws, which
gives every sentence's exact probability without trusting the automaton. From that table the
true conditional of each token follows by summing sentence probabilities over prefixes (and,
for a row that starts mid-sentence, over every sentence and every position a row could start
at). The automaton must give the same numbers."""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict

import numpy as np
import pytest
from helpers import TINY_LM

from blockbench.cell.train import train
from blockbench.config import build_run_config
from blockbench.tasks.data import agreement
from blockbench.tasks.data.agreement import SEPARATOR_ID, generate_agreement_corpus, unigram_entropy
from blockbench.tasks.data.agreement_floor import GrammarAutomaton, agreement_grammar, grammar_automaton
from blockbench.tasks.lm import AgreementDataModule, LMTaskConfig

ID = {word: i for i, word in enumerate(agreement.agreement_vocab())}


class Impossible(Exception):
    """A scripted branch of probability zero: nothing below it is ever sampled."""


class ScriptedDraws:
    """Stands in for ``agreement._Draws``: takes the branches ``script`` names (0 past its end) and
    multiplies their probabilities, recording how many branches each draw had."""

    def __init__(self, script: list[int]):
        self.script, self.position, self.probability, self.arities = list(script), 0, 1.0, []

    def _branch(self, n: int) -> int:
        if self.position == len(self.script):
            self.script.append(0)
        self.arities.append(n)
        self.position += 1
        return self.script[self.position - 1]

    def chance(self, p: float) -> bool:
        taken = self._branch(2) == 0
        self.probability *= p if taken else 1 - p
        if self.probability == 0:
            raise Impossible
        return taken

    def pick(self, options):
        choice = self._branch(len(options))
        self.probability /= len(options)
        return options[choice]


def enumerate_sentences(max_depth: int) -> dict[tuple[int, ...], float]:
    """Every sentence the sampler can draw, with its probability (summed over its derivations):
    a depth-first walk over the draws, like an odometer."""
    sentences: dict[tuple[int, ...], float] = defaultdict(float)
    script: list[int] = []
    while True:
        draws = ScriptedDraws(script)
        with contextlib.suppress(Impossible):
            sentences[tuple(agreement._sentence(draws, max_depth).tokens)] += draws.probability
        script = draws.script[: draws.position]
        while script and script[-1] + 1 == draws.arities[len(script) - 1]:
            script.pop()
        if not script:
            return dict(sentences)
        script[-1] += 1


@pytest.fixture
def tiny(monkeypatch):
    """The task's grammar over one noun, one transitive verb, one adjective, one modifying and two
    locative prepositions ("near" in both roles, as in the real lexicon)."""

    def use(max_depth: int, p_adjective: float = agreement.P_ADJECTIVE):
        monkeypatch.setattr(agreement, "_NOUN_IDS", [(ID["key"], ID["keys"])])
        monkeypatch.setattr(agreement, "_VERB_IDS", [(ID["sees"], ID["see"])])
        monkeypatch.setattr(agreement, "_ADJECTIVE_IDS", [ID["red"]])
        monkeypatch.setattr(agreement, "_MODIFIER_IDS", [ID["near"]])
        monkeypatch.setattr(agreement, "_LOCATIVE_IDS", [ID["on"], ID["near"]])
        monkeypatch.setattr(agreement, "P_ADJECTIVE", p_adjective)
        return enumerate_sentences(max_depth), GrammarAutomaton(agreement_grammar(max_depth))

    return use


def prefix_masses(sentences: dict[tuple[int, ...], float]) -> dict[tuple[int, ...], float]:
    """P(a sentence begins with the prefix), for every prefix of every sentence."""
    masses: dict[tuple[int, ...], float] = defaultdict(float)
    for sentence, p in sentences.items():
        for end in range(len(sentence) + 1):
            masses[sentence[:end]] += p
    return masses


def stream_prefix_mass(tokens: tuple[int, ...], masses: dict) -> float:
    """P(a stream of sentences, read from a sentence start, begins with ``tokens``): the sentences
    are independent and "." ends each, so the product over the complete ones and the last part."""
    mass, start = 1.0, 0
    for end, token in enumerate(tokens):
        if token == SEPARATOR_ID:
            mass *= masses.get(tokens[start : end + 1], 0.0)
            start = end + 1
    return mass * masses.get(tokens[start:], 0.0)


def fragment_mass(tokens: tuple[int, ...], sentences: dict, masses: dict) -> float:
    """P(the stream, at a random position, continues with ``tokens``): a position falls at offset j
    of sentence s with probability P(s) / E[length] (the renewal argument), then the rest of s and
    fresh sentences follow."""
    expected_length = sum(p * len(s) for s, p in sentences.items())
    total = 0.0
    for sentence, p in sentences.items():
        for offset in range(len(sentence)):
            tail = sentence[offset:]
            if len(tokens) <= len(tail):
                total += p * (tail[: len(tokens)] == tokens)
            elif tokens[: len(tail)] == tail:
                total += p * stream_prefix_mass(tokens[len(tail) :], masses)
    return total / expected_length


def sample_stream(n_tokens: int, max_depth: int, seed: int) -> np.ndarray:
    return agreement._stream(agreement._Draws(np.random.default_rng(seed)), n_tokens, max_depth)[0]


@pytest.mark.parametrize(("max_depth", "p_adjective"), [(1, agreement.P_ADJECTIVE), (2, 0.0)])
def test_the_automaton_gives_every_sentence_its_sampling_probability(tiny, max_depth, p_adjective):
    """Every sentence read from a sentence start costs -log of its exact probability; with the
    probabilities summing to 1, the automaton's language is the sampler's, sentence for sentence.
    (Depth 2 has the ambiguous relative clauses; its adjectives are off to keep the table small.)"""
    sentences, automaton = tiny(max_depth, p_adjective)
    assert sum(sentences.values()) == pytest.approx(1, abs=1e-12)
    assert len(sentences) > 100
    for sentence, p in sentences.items():
        assert automaton.stream_cross_entropy(np.array(sentence)).sum() == pytest.approx(-math.log(p), rel=1e-9)


def test_stream_losses_are_the_true_conditionals(tiny):
    sentences, automaton = tiny(2, 0.0)
    masses = prefix_masses(sentences)
    stream = sample_stream(60, 2, seed=0)
    expected = [
        -math.log(stream_prefix_mass(tuple(stream[: t + 1]), masses) / stream_prefix_mass(tuple(stream[:t]), masses))
        for t in range(len(stream))
    ]
    np.testing.assert_allclose(automaton.stream_cross_entropy(stream), expected, rtol=1e-9, atol=1e-12)


def test_row_losses_are_the_true_conditionals_from_a_random_position(tiny):
    """A row starts anywhere in a sentence: its floor sums over every place it could start."""
    sentences, automaton = tiny(2, 0.0)
    masses = prefix_masses(sentences)
    stream = sample_stream(40, 2, seed=1)
    rows = np.stack([stream[3:10], stream[17:24], stream[30:37]])  # rows of 7 tokens, starting mid-sentence
    expected = np.array(
        [
            [
                -math.log(
                    fragment_mass(tuple(row[: t + 1]), sentences, masses)
                    / fragment_mass(tuple(row[:t]), sentences, masses)
                )
                for t in range(1, len(row))
            ]
            for row in rows
        ]
    )
    np.testing.assert_allclose(automaton.row_cross_entropy(rows), expected, rtol=1e-9, atol=1e-12)
    assert automaton.stationary @ sum(automaton.transitions.values()) == pytest.approx(automaton.stationary)


def test_a_token_outside_the_language_is_refused():
    automaton = grammar_automaton(2)
    with pytest.raises(ValueError, match="not from this language"):
        automaton.row_cross_entropy(np.array([[ID["the"], ID["the"], ID["key"]]]))


def test_the_floor_of_the_data_seed_1234_validation_stream():
    """The validation stream of data_seed=1234 (the book's data while a fixed data seed drew it): with the
    whole stream in view 1.869 nats/token (perplexity 6.48); a model sees one 65-token row at a time,
    and its floor is 0.021 nats higher, the first tokens of a row lacking their sentence's start."""
    corpus = generate_agreement_corpus(n_train_tokens=10, n_val_tokens=16_384, n_probes=1, max_depth=2, seed=1234)
    datamodule = AgreementDataModule(LMTaskConfig(data_seed=1234, n_train_tokens=400_000, n_probes=8), batch_size=8)
    datamodule.setup("fit")
    np.testing.assert_array_equal(datamodule.corpus.val, corpus.val)
    floor = datamodule.floor
    assert floor.full_context == pytest.approx(1.8686, abs=1e-4) and math.exp(floor.full_context) == pytest.approx(
        6.48, abs=5e-3
    )
    assert floor.loss == pytest.approx(1.8900, abs=1e-4)
    baselines = datamodule.baselines()
    assert baselines["loss_floor"] == floor.loss and baselines["perplexity_floor"] == pytest.approx(
        math.exp(floor.loss)
    )
    assert baselines["loss"] == floor.unigram == unigram_entropy(datamodule.corpus.train, 67) > floor.loss + 1


def test_a_cell_records_the_floor_and_its_distance_from_it(tmp_path):
    run = build_run_config(TINY_LM, {})
    result = train(run, tmp_path / "out", tb_dir=tmp_path / "tb", tb_name="floor", tb_version="0")
    assert result.status == "ok"
    floor, unigram = result.baselines["loss_floor"], result.baselines["loss"]
    datamodule = AgreementDataModule(run.task, batch_size=8, seed=run.seed)
    datamodule.setup("fit")
    assert floor == pytest.approx(grammar_automaton(2).row_cross_entropy(datamodule.val_rows.numpy()).mean())
    for metrics in (result.metrics, result.history[-1].metrics):
        loss = metrics["loss"]
        assert metrics["excess_loss"] == pytest.approx(loss - floor, rel=1e-5)
        assert metrics["gap_closed"] == pytest.approx((unigram - loss) / (unigram - floor), rel=1e-5)
    assert result.primary_metric == "perplexity"
