"""Trivial baselines that more than one task reports next to its metrics.

A baseline shows that a model learned something: it is the score of a rule that never looks at
the input, such as always predicting the class most frequent in training. A baseline that only
one task uses stays with that task's data (e.g. ``data.agreement.unigram_entropy``).
"""

from __future__ import annotations

import numpy as np


def majority_class_accuracy(train_labels: np.ndarray, val_labels: np.ndarray) -> float:
    """Validation accuracy of always predicting the class most frequent in the training labels
    (the trivial baseline). The class comes from training, as a model's would: choosing it by the
    validation labels would let the baseline peek at the answers. When several classes tie in
    training (balanced data), it is the mean accuracy over them, i.e. picking one of them at random,
    rather than a tie-break that favours whichever class comes first."""
    train_labels, val_labels = np.asarray(train_labels), np.asarray(val_labels)
    n_classes = int(max(train_labels.max(), val_labels.max())) + 1
    train_counts = np.bincount(train_labels, minlength=n_classes)
    majority = np.flatnonzero(train_counts == train_counts.max())
    return float(np.bincount(val_labels, minlength=n_classes)[majority].mean() / val_labels.size)
