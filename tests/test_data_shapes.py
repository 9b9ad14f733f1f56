"""The rendered-shapes dataset: deterministic, balanced, and its label is what the image shows."""

import numpy as np
from scipy import ndimage

from tasks.data.shapes import CLASS_NAMES, MIN_COUNT, generate_shapes, majority_class_accuracy, shapes_class_names


def test_same_seed_same_images_other_seed_other_images():
    a, b = generate_shapes(n_images=50, seed=7), generate_shapes(n_images=50, seed=7)
    c = generate_shapes(n_images=50, seed=8)
    assert np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels)
    assert not np.array_equal(a.images, c.images)


def test_arrays_and_balance():
    data = generate_shapes(n_images=500, seed=0)
    assert data.images.shape == (500, 32, 32, 3) and data.images.dtype == np.uint8
    assert data.labels.shape == (500,) and data.labels.dtype == np.int64
    assert data.class_names == shapes_class_names() == list(CLASS_NAMES)
    assert np.bincount(data.labels, minlength=len(CLASS_NAMES)).tolist() == [100] * len(CLASS_NAMES)


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


def test_majority_class_accuracy():
    assert majority_class_accuracy(np.array([0, 1, 1, 2, 1, 0])) == 0.5
    assert majority_class_accuracy(generate_shapes(n_images=100, seed=0).labels) == 0.2
