"""The training seed draws a generated task's data (``task.data_seed: null``, the default), and an
int ``data_seed`` fixes the draw: the seed variance of the summary then includes the data or not,
as ``seed_varies`` says."""

from __future__ import annotations

import zlib

import lightning as L
import numpy as np
import pytest
from helpers import TINY_LM

from blockbench.cell.train import train
from blockbench.config import build_run_config
from blockbench.tasks import TASK_CONFIGS
from blockbench.tasks.configs import derived_data_seed
from blockbench.tasks.lm import AgreementDataModule, LMTaskConfig
from blockbench.tasks.translation import ParallelDataModule, TranslationTaskConfig
from blockbench.tasks.vision import ShapesDataModule, VisionTaskConfig

#: (config, datamodule class, the training and validation arrays of a set-up datamodule) per generated task
GENERATED = {
    "lm": (
        LMTaskConfig(seq_len=16, n_train_tokens=600, n_val_tokens=200, n_probes=8),
        AgreementDataModule,
        lambda d: (d.train_rows.numpy(), d.val_rows.numpy(), d.probes.tensors[0].numpy()),
    ),
    "translation": (
        TranslationTaskConfig(n_train=40, n_val=10),
        ParallelDataModule,
        lambda d: (d.corpus.train.src, d.corpus.train.tgt, d.corpus.val.src, d.corpus.val.tgt),
    ),
    "vit": (
        VisionTaskConfig(n_train=10, n_val=5),
        ShapesDataModule,
        lambda d: (d.train_set.tensors[0].numpy(), d.val_set.tensors[0].numpy()),
    ),
}


def arrays(task: str, seed: int, **fields) -> tuple[np.ndarray, ...]:
    """The training and validation data (and the LM's probes) a run of ``task`` with training seed ``seed`` sees."""
    cfg, datamodule_class, read = GENERATED[task]
    datamodule = datamodule_class(cfg.model_copy(update=fields), batch_size=2, seed=seed)
    datamodule.setup("fit")
    return read(datamodule)


def same(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> list[bool]:
    return [x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b, strict=True)]


@pytest.mark.parametrize("task", GENERATED)
def test_by_default_each_seed_draws_its_own_training_and_validation_data(task):
    assert GENERATED[task][0].data_seed is None
    first, again, other = arrays(task, 0), arrays(task, 0), arrays(task, 1)
    assert all(same(first, again))  # the same seed twice: the same data, bit for bit
    assert not any(same(first, other))  # another seed: every array differs (training and validation)


@pytest.mark.parametrize("task", GENERATED)
def test_an_int_data_seed_fixes_the_draw_for_every_training_seed(task):
    fixed = [arrays(task, seed, data_seed=1234) for seed in (0, 1, 7)]
    assert all(same(fixed[0], fixed[1])) and all(same(fixed[0], fixed[2]))
    assert not any(same(fixed[0], arrays(task, 0, data_seed=1235)))


def test_the_derived_data_seed_is_the_documented_seed_sequence():
    """``SeedSequence([seed mod 2**64, crc32(task name)])``, its first 64-bit word, written out here."""
    for seed, name in ((0, "lm"), (3, "vit"), (-1, "translation")):
        words = np.random.SeedSequence([seed % 2**64, zlib.crc32(name.encode())]).generate_state(2, dtype=np.uint32)
        assert derived_data_seed(seed, name) == int(words[0]) | int(words[1]) << 32
    assert derived_data_seed(0, "lm") != derived_data_seed(0, "vit")  # tasks do not share a draw
    assert LMTaskConfig().data_seed_for(5) == derived_data_seed(5, "lm")
    assert LMTaskConfig(data_seed=1234).data_seed_for(5) == 1234


def test_seed_varies_says_whether_the_data_draw_is_in_the_seed_variance():
    assert LMTaskConfig().seed_varies() == (
        "the data draw, the order of the training data, the initialisation and dropout"
    )
    assert VisionTaskConfig(data_seed=1234).seed_varies() == (
        "the order of the training data, the initialisation and dropout; the data draw is fixed (data_seed=1234)"
    )
    image = TASK_CONFIGS["image_classification"].model_validate({"data": {"source": "npz", "path": "x.npz"}})
    assert image.seed_varies() == (
        "the order of the training data, augmentation, the initialisation and dropout; "
        "the data are the dataset's own, the same for every seed"
    )


class DataSpy(L.Callback):
    """Keeps the datamodule a cell trained with."""

    def on_fit_end(self, trainer, pl_module):
        self.datamodule = trainer.datamodule


def test_a_cell_draws_its_data_from_its_training_seed(tmp_path):
    """The runner passes the run's seed to the task: a cell with seed 3 trains and validates on the
    draw of seed 3 (what a datamodule built for seed 3 holds), not on seed 0's."""
    run = build_run_config({**TINY_LM, "seed": 3}, {})
    spy = DataSpy()
    result = train(
        run, tmp_path / "out", tb_dir=tmp_path / "tb", tb_name="seed3", tb_version="0", extra_callbacks=[spy]
    )
    assert result.status == "ok"
    assert spy.datamodule.data_seed == derived_data_seed(3, "lm")
    for seed in (3, 0):
        expected = AgreementDataModule(run.task, batch_size=8, seed=seed)
        expected.setup("fit")
        drawn_alike = np.array_equal(spy.datamodule.corpus.train, expected.corpus.train)
        assert drawn_alike == (seed == 3)
