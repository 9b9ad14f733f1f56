"""The entropy floor of the agreement language: the loss of the best possible model, exactly.

The grammar of ``data.agreement`` nests at most ``max_depth`` deep, so it is a finite-state
language: this module compiles it into a probabilistic finite automaton whose states are the
generator's pending work (a stack: "emit a noun, then this noun phrase's modifiers, then the
relative clause's verb in the head's number, ..."), each transition emitting one token with the
probability the sampler draws it with. The grammar is ambiguous (in ``the key near the door
that the man sees ...`` the relative clause may belong to "door" or to "key", and what may follow
differs), so several states can explain a prefix; the forward algorithm sums over them and gives
the true conditional probability of every next token given the tokens before it.

The cross-entropy of those true conditionals on a validation set is the floor no model can beat
in expectation (its excess is the KL divergence of the model from the truth). Computed on the
validation rows themselves, it is exact for that set (no sampling error of its own), which a
closed form would not be: the entropy rate of an ambiguous grammar has none. A model sees one
row at a time, starting anywhere in a sentence, so each row starts from the automaton's
stationary distribution (where in the language a random position of the stream lies) and the
first targets of a row cost more than the same tokens with the sentence's start in view:
``row_cross_entropy`` is the floor of what the model sees, ``stream_cross_entropy`` the one of
the whole stream read from its start.

Written by hand because no library compiles a bounded-depth probabilistic grammar into an
automaton; scipy does the sparse algebra (forward steps, the stationary distribution).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

import numpy as np
import scipy.sparse
import scipy.sparse.linalg

from . import agreement as grammar_module


@dataclass(frozen=True)
class AgreementGrammar:
    """The lexicon (as token ids) and the probabilities of the agreement grammar: what the sampler
    in ``data.agreement`` draws from. ``agreement_grammar`` reads the task's own; a test can build
    a tiny one whose sentences are few enough to enumerate."""

    nouns: tuple[tuple[int, int], ...]  # (singular, plural) ids
    verbs: tuple[tuple[int, int], ...]  # transitive verbs, (singular, plural) ids
    copula: tuple[int, int]
    adjectives: tuple[int, ...]
    modifiers: tuple[int, ...]  # prepositions that attach a noun phrase to a noun
    locatives: tuple[int, ...]  # prepositions of the "is on the table" complement
    the: int
    that: int
    separator: int
    vocab_size: int
    max_depth: int
    p_adjective: float
    p_prepositional_phrase: float
    p_relative_clause: float
    p_copula: float
    p_adjective_complement: float


def agreement_grammar(max_depth: int) -> AgreementGrammar:
    """The grammar the ``lm`` task samples from, nesting at most ``max_depth`` deep: the lexicon and
    probabilities ``data.agreement`` holds when called."""
    g = grammar_module
    return AgreementGrammar(
        nouns=tuple(g._NOUN_IDS),
        verbs=tuple(g._VERB_IDS),
        copula=g._COPULA_IDS,
        adjectives=tuple(g._ADJECTIVE_IDS),
        modifiers=tuple(g._MODIFIER_IDS),
        locatives=tuple(g._LOCATIVE_IDS),
        the=g._THE,
        that=g._THAT,
        separator=g.SEPARATOR_ID,
        vocab_size=len(g.agreement_vocab()),
        max_depth=max_depth,
        p_adjective=g.P_ADJECTIVE,
        p_prepositional_phrase=g.P_PREPOSITIONAL_PHRASE,
        p_relative_clause=g.P_RELATIVE_CLAUSE,
        p_copula=g.P_COPULA,
        p_adjective_complement=g.P_ADJECTIVE_COMPLEMENT,
    )


# Stack items, the top of a stack last. Emitting items: ("tok", ids) one of ids, uniformly;
# ("noun", sets_verb) a noun of either number (the head of a clause sets the number of the verb
# waiting below it); ("verb", number) a transitive verb of a relative clause; ("end",) the ".".
# Silent items expand into others: ("np", depth, sets_verb), ("mods", depth), ("rc", depth),
# ("main", number) (the main verb and its complement), ("compl",) (after "is"/"are").
_SENTENCE = (("end",), ("main", None), ("np", 0, True))
_EMITTING = {"tok", "noun", "verb", "end"}


class GrammarAutomaton:
    """``grammar`` as a probabilistic finite automaton: ``transitions[w][s, t]`` is the probability
    that state ``s`` emits token ``w`` and moves to state ``t``; ``start`` is the distribution of the
    state before a sentence's first token, ``stationary`` the one at a random position of an endless
    stream of sentences (each state's share of the stream's positions)."""

    def __init__(self, grammar: AgreementGrammar):
        self.grammar = grammar
        self._expanded: dict[tuple, list[tuple[float, tuple]]] = {}
        index: dict[tuple, int] = {}
        entries: dict[int, tuple[list[int], list[int], list[float]]] = {}

        def state(stack: tuple) -> int:
            if stack not in index:
                index[stack] = len(index)
                queue.append(stack)
            return index[stack]

        queue: list[tuple] = []
        start = [(p, state(stack)) for p, stack in self._expand(_SENTENCE)]
        while queue:
            stack = queue.pop()
            source = index[stack]
            for token, p, rest in self._emit(stack):
                for q, target in self._expand(rest):
                    rows, cols, probs = entries.setdefault(token, ([], [], []))
                    rows.append(source)
                    cols.append(state(target))
                    probs.append(p * q)
        self.n_states = len(index)
        shape = (self.n_states, self.n_states)
        self.transitions: dict[int, scipy.sparse.csr_array] = {
            token: scipy.sparse.csr_array((probs, (rows, cols)), shape=shape)  # duplicates are summed
            for token, (rows, cols, probs) in entries.items()
        }
        self.start = np.zeros(self.n_states)
        for p, s in start:
            self.start[s] += p
        self.stationary = self._stationary()

    # ------------------------------------------------------------------ compiling the grammar

    def _expand(self, stack: tuple) -> list[tuple[float, tuple]]:
        """The stacks with an emitting item on top that ``stack`` becomes, with their probabilities."""
        if stack in self._expanded:
            return self._expanded[stack]
        g = self.grammar
        top, rest = stack[-1], stack[:-1]
        kind = top[0]
        if kind in _EMITTING:
            out = [(1.0, stack)]
        else:
            if kind == "np":
                _, depth, sets_verb = top
                after = (*rest, ("mods", depth)) if depth < g.max_depth else rest
                noun = (*after, ("noun", sets_verb))
                branches = [
                    (g.p_adjective, (*noun, ("tok", g.adjectives), ("tok", (g.the,)))),
                    (1 - g.p_adjective, (*noun, ("tok", (g.the,)))),
                ]
            elif kind == "mods":
                depth = top[1]
                branches = [
                    (g.p_prepositional_phrase, (*rest, ("rc", depth), ("np", depth + 1, False), ("tok", g.modifiers))),
                    (1 - g.p_prepositional_phrase, (*rest, ("rc", depth))),
                ]
            elif kind == "rc":
                depth = top[1]
                clause = (*rest, ("verb", None), ("np", depth + 1, True), ("tok", (g.that,)))
                branches = [(g.p_relative_clause, clause), (1 - g.p_relative_clause, rest)]
            elif kind == "main":
                number = top[1]
                verbs = tuple(pair[number] for pair in g.verbs)
                branches = [
                    (g.p_copula, (*rest, ("compl",), ("tok", (g.copula[number],)))),
                    (1 - g.p_copula, (*rest, ("np", g.max_depth, False), ("tok", verbs))),
                ]
            elif kind == "compl":
                branches = [
                    (g.p_adjective_complement, (*rest, ("tok", g.adjectives))),
                    (1 - g.p_adjective_complement, (*rest, ("np", g.max_depth, False), ("tok", g.locatives))),
                ]
            else:
                raise AssertionError(f"unknown grammar item {top}")
            out = [(p * q, s) for p, branch in branches if p > 0 for q, s in self._expand(branch)]
        self._expanded[stack] = out
        return out

    def _emit(self, stack: tuple) -> Iterable[tuple[int, float, tuple]]:
        """(token, probability, the stack left after it) of each token the top item emits."""
        g = self.grammar
        top, rest = stack[-1], stack[:-1]
        kind = top[0]
        if kind == "tok":
            for token in top[1]:
                yield token, 1 / len(top[1]), rest
        elif kind == "noun":
            for number in (0, 1):
                after = _set_waiting_verb(rest, number) if top[1] else rest
                for pair in g.nouns:
                    yield pair[number], 0.5 / len(g.nouns), after
        elif kind == "verb":
            for pair in g.verbs:
                yield pair[top[1]], 1 / len(g.verbs), rest
        elif kind == "end":
            yield g.separator, 1.0, _SENTENCE
        else:
            raise AssertionError(f"{top} does not emit")

    def _stationary(self) -> np.ndarray:
        """The stationary distribution of the state chain (``pi P = pi``, summing to 1): an exact
        linear solve, with one balance equation replaced by the normalisation."""
        chain = sum(self.transitions.values())
        system = (chain.T - scipy.sparse.identity(self.n_states)).tolil()
        system[0, :] = 1
        rhs = np.zeros(self.n_states)
        rhs[0] = 1
        return np.clip(scipy.sparse.linalg.spsolve(system.tocsc(), rhs), 0, None)

    # ------------------------------------------------------------------ the forward algorithm

    def row_cross_entropy(self, rows: np.ndarray) -> np.ndarray:
        """``-log P(rows[:, t] | rows[:, :t])`` for t >= 1, in nats, shape (N, L - 1): the loss of the
        true conditional on each target of each row, a row starting at a random position of the
        stream (the stationary distribution) and seeing only its own earlier tokens, as a model does."""
        rows = np.asarray(rows)
        n_rows, length = rows.shape
        belief = np.tile(self.stationary, (n_rows, 1))
        losses = np.zeros((n_rows, length - 1))
        for t in range(length):
            mass = np.zeros(n_rows)
            for token in np.unique(rows[:, t]):
                chosen = rows[:, t] == token
                if int(token) not in self.transitions:
                    raise ValueError(f"token {int(token)} cannot occur in the grammar's language")
                belief[chosen] = belief[chosen] @ self.transitions[int(token)]
                mass[chosen] = belief[chosen].sum(axis=1)
            if (mass <= 0).any():
                raise ValueError("a row has zero probability under the grammar: it is not from this language")
            belief /= mass[:, None]
            if t:
                losses[:, t - 1] = -np.log(mass)
        return losses

    def stream_cross_entropy(self, stream: np.ndarray) -> np.ndarray:
        """``-log P(stream[t] | stream[:t])`` for every t, in nats: the stream read from its start
        (a sentence start), every earlier token in view."""
        belief, losses = self.start.copy(), np.zeros(len(stream))
        for t, token in enumerate(np.asarray(stream).tolist()):
            belief = belief @ self.transitions[token]
            mass = belief.sum()
            if mass <= 0:
                raise ValueError(f"token {t} of the stream has zero probability under the grammar")
            losses[t] = -np.log(mass)
            belief /= mass
        return losses


def _set_waiting_verb(stack: tuple, number: int) -> tuple:
    """``stack`` with its topmost verb still waiting for a number (the clause's) given ``number``."""
    for i in range(len(stack) - 1, -1, -1):
        if stack[i][0] in ("verb", "main") and stack[i][1] is None:
            return (*stack[:i], (stack[i][0], number), *stack[i + 1 :])
    raise AssertionError("a clause head without a verb waiting for its number")


@cache
def grammar_automaton(max_depth: int) -> GrammarAutomaton:
    """The ``lm`` task's grammar at ``max_depth`` as an automaton, compiled once per process."""
    return GrammarAutomaton(agreement_grammar(max_depth))


def entropy_floor(rows: np.ndarray, max_depth: int) -> float:
    """The mean loss (nats per target token) of the true conditional distribution on validation
    ``rows`` (each row's inputs and, shifted by one, its targets): no model reaches below it in
    expectation."""
    return float(grammar_automaton(max_depth).row_cross_entropy(rows).mean())
