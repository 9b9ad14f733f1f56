"""The rendered-shapes dataset: deterministic, balanced, and its label is what the image shows."""

import hashlib

import numpy as np
import pytest
from scipy import ndimage

from blockbench.tasks.baselines import majority_class_accuracy
from blockbench.tasks.data.shapes import MIN_COUNT, generate_shapes, shapes_class_names


def test_same_seed_same_images_other_seed_other_images():
    a, b = generate_shapes(n_images=50, seed=7), generate_shapes(n_images=50, seed=7)
    c = generate_shapes(n_images=50, seed=8)
    assert np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels)
    assert not np.array_equal(a.images, c.images)


def test_arrays_and_balance():
    data = generate_shapes(n_images=500, seed=0)
    assert data.images.shape == (500, 32, 32, 3) and data.images.dtype == np.uint8
    assert data.labels.shape == (500,) and data.labels.dtype == np.int64
    assert data.class_names == shapes_class_names() and len(data.class_names) == 5
    assert np.bincount(data.labels, minlength=5).tolist() == [100] * 5


def test_defaults_draw_the_images_they_always_drew():
    """The harder settings' defaults keep every image of the book's cells: the digest of 300 images
    drawn before ``max_shapes`` and ``pixel_noise_std`` existed."""
    data = generate_shapes(n_images=300, seed=11)
    assert hashlib.sha256(data.images.tobytes() + data.labels.tobytes()).hexdigest()[:16] == "c1929078aa7637db"
    explicit = generate_shapes(n_images=300, seed=11, max_shapes=5, pixel_noise_std=8.0)
    assert np.array_equal(explicit.images, data.images)


def test_more_shapes_more_classes_and_the_label_is_still_the_count():
    data = generate_shapes(n_images=900, seed=4, max_shapes=9)
    assert data.class_names[-1] == "9 shapes" and len(data.class_names) == 9
    assert np.bincount(data.labels, minlength=9).tolist() == [100] * 9
    counted = np.array([count_shapes(image) for image in data.images])
    # nine shapes fill every cell of the layout, so neighbours touch more often than with five
    assert (counted == data.labels + MIN_COUNT).mean() >= 0.95


def test_pixel_noise_is_the_noise_on_the_background():
    """Away from the shapes the pixels are the background grey plus noise of the requested spread."""
    for noise in (0.0, 8.0, 30.0):
        data = generate_shapes(n_images=200, seed=5, max_shapes=2, pixel_noise_std=noise)
        edge = data.images[:, 0, :, :].astype(np.float64)  # no shape reaches the top row (centres >= 5 px in)
        spread = (edge - edge.mean(axis=(1, 2), keepdims=True)).std()
        assert spread == pytest.approx(noise, abs=0.5 + 0.05 * noise)


@pytest.mark.parametrize("max_shapes", [1, 10])
def test_max_shapes_outside_the_layout_is_refused(max_shapes):
    with pytest.raises(ValueError, match="max_shapes must be between 2 and 9"):
        generate_shapes(n_images=10, max_shapes=max_shapes)


def count_shapes(image: np.ndarray) -> int:
    """Connected blobs of coloured (saturated) or bright pixels; the background is grey and darker."""
    pixels = image.astype(np.int16)
    shape_pixels = ((pixels.max(-1) - pixels.min(-1)) > 60) | (pixels.mean(-1) > 165)
    return ndimage.label(shape_pixels)[1]


def test_label_is_the_number_of_shapes_drawn():
    data = generate_shapes(n_images=1000, seed=3)
    counted = np.array([count_shapes(image) for image in data.images])
    # shapes in neighbouring cells may touch and merge into one blob now and then
    assert (counted == data.labels + MIN_COUNT).mean() >= 0.99
    assert shapes_class_names()[0] == "1 shape" and shapes_class_names()[-1] == "5 shapes"


def test_majority_class_accuracy_takes_the_class_from_the_training_labels():
    # training majority: class 1; validation majority: class 0 (3 of 6), class 1 is 1 of 6
    assert majority_class_accuracy(np.array([0, 1, 1, 2, 1, 0]), np.array([0, 0, 0, 1, 2, 2])) == 1 / 6
    # classes 0 and 1 tie in training: the mean of their validation accuracies, (1 + 3) / 2 of 6
    assert majority_class_accuracy(np.array([0, 0, 1, 1, 2]), np.array([0, 1, 1, 1, 2, 2])) == 2 / 6
    # a class that never occurs in validation scores 0
    assert majority_class_accuracy(np.array([4, 4, 0]), np.array([0, 1])) == 0.0
    balanced = generate_shapes(n_images=100, seed=0).labels
    assert majority_class_accuracy(balanced, generate_shapes(n_images=100, seed=1).labels) == 0.2


def test_vit_baseline_is_the_training_majority_scored_on_validation(monkeypatch):
    """The datamodule's baseline: the class most frequent in training (3), scored on validation,
    where class 0 is the most frequent, not the validation majority's 3/5."""
    import blockbench.tasks.vision
    from blockbench.tasks.data.shapes import ShapesDataset
    from blockbench.tasks.vision import ShapesDataModule, VisionTaskConfig

    labels = {6: [3, 3, 3, 0, 1, 2], 5: [0, 0, 0, 3, 1]}  # by n_images: training, validation

    def fake_shapes(*, n_images, image_size, seed, **settings):
        images = np.random.default_rng(seed).integers(0, 256, (n_images, image_size, image_size, 3), dtype=np.uint8)
        return ShapesDataset(images, np.array(labels[n_images], dtype=np.int64), shapes_class_names())

    monkeypatch.setattr(blockbench.tasks.vision, "generate_shapes", fake_shapes)
    datamodule = ShapesDataModule(VisionTaskConfig(n_train=6, n_val=5), batch_size=2)
    datamodule.setup("fit")
    assert datamodule.baselines() == {"accuracy": 1 / 5}
