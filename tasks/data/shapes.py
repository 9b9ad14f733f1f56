"""Procedurally drawn shape images whose class is the number of shapes in the image.

Every image shows, on a noisy grey background, 1 to ``max_shapes`` shapes (5 by default, at most
9) of random kind (square, circle, triangle, cross, diamond), colour, shade and size. Each shape
sits in its own cell of a 3x3 layout, jittered, so shapes never overlap. The label is the count:
class ``k`` is ``k + 1`` shapes. Classes are balanced exactly (up to ``n_images % max_shapes``),
so the majority-class baseline is ``1 / max_shapes`` (20% by default).

Two settings make the task harder without changing what it asks: more shapes (telling 8 from 9
means checking every cell) and more pixel noise (small dark shapes fade into the background).
Their defaults draw exactly the images they always drew.

Why the rule needs global context: a 4x4 ViT patch shows at most part of one shape, and shapes
lie up to the whole image apart; neither the kinds, colours nor sizes carry the label. A model
has to find every shape wherever it is and aggregate over the whole image. Why a count and not
a relation rule: docs/decisions/shapes-counting-rule.md.

    data = generate_shapes(n_images=20_000, seed=0)   # images (N, 32, 32, 3) uint8, labels (N,)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_COUNT = 1
DEFAULT_MAX_SHAPES = 5
SHAPE_KINDS = ("square", "circle", "triangle", "cross", "diamond")
SHAPE_COLOURS = (
    (220, 40, 40),
    (40, 60, 220),
    (40, 200, 40),
    (220, 210, 40),
    (225, 225, 225),
    (40, 200, 210),
    (210, 40, 210),
)
COLOUR_JITTER = 30  # each shape's RGB is its base colour +- this, per channel

HALF_SIZE_RANGE = (2.5, 4.0)  # shape "radius" in pixels: shapes are 5 to 9 pixels across
STAMP_RADIUS = 5  # a shape is drawn inside the 11x11 window around its centre
GRID = 3  # shapes sit in distinct cells of a 3x3 layout
MAX_SHAPES = GRID * GRID  # the most shapes an image can hold
CELL_JITTER = 1.5  # pixels a shape may move from its cell's centre
BACKGROUND_GREY_RANGE = (60, 130)
DEFAULT_PIXEL_NOISE_STD = 8.0  # Gaussian noise added to every pixel and channel, in grey levels


@dataclass(frozen=True)
class ShapesDataset:
    images: np.ndarray  # uint8 (N, H, W, 3)
    labels: np.ndarray  # int64 (N,)
    class_names: list[str]


def shapes_class_names(max_shapes: int = DEFAULT_MAX_SHAPES) -> list[str]:
    """The class names, indexed by label ("1 shape" to "``max_shapes`` shapes"), known before any image is drawn."""
    if not MIN_COUNT < max_shapes <= MAX_SHAPES:
        raise ValueError(f"max_shapes must be between {MIN_COUNT + 1} and {MAX_SHAPES}, got {max_shapes}")
    return [f"{n} shape{'s' if n > 1 else ''}" for n in range(MIN_COUNT, max_shapes + 1)]


def generate_shapes(
    *,
    n_images: int,
    image_size: int = 32,
    seed: int = 0,
    max_shapes: int = DEFAULT_MAX_SHAPES,
    pixel_noise_std: float = DEFAULT_PIXEL_NOISE_STD,
) -> ShapesDataset:
    """Render ``n_images`` labelled images of 1 to ``max_shapes`` shapes under ``pixel_noise_std`` of
    noise; the same arguments always give the same dataset."""
    if image_size < 4 * STAMP_RADIUS:
        raise ValueError(f"image_size must be at least {4 * STAMP_RADIUS}, got {image_size}")
    if pixel_noise_std < 0:
        raise ValueError(f"pixel_noise_std must be at least 0, got {pixel_noise_std}")
    class_names = shapes_class_names(max_shapes)
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n_images) % len(class_names)).astype(np.int64)
    counts = labels + MIN_COUNT

    background = rng.uniform(*BACKGROUND_GREY_RANGE, size=(n_images, 1, 1, 1))
    canvas = np.broadcast_to(background, (n_images, image_size, image_size, 3)).astype(np.float32)

    # each shape gets its own cell of a GRID x GRID layout (a random choice of cells per image),
    # jittered inside it, so shapes never overlap and every one of them can be counted
    cells = np.argsort(rng.random((n_images, GRID * GRID)), axis=1)
    cell_size = image_size / GRID
    low, high = STAMP_RADIUS, image_size - 1 - STAMP_RADIUS
    for slot in range(max_shapes):
        column, row = cells[:, slot] % GRID, cells[:, slot] // GRID
        centres_x = np.clip((column + 0.5) * cell_size + rng.uniform(-CELL_JITTER, CELL_JITTER, n_images), low, high)
        centres_y = np.clip((row + 0.5) * cell_size + rng.uniform(-CELL_JITTER, CELL_JITTER, n_images), low, high)
        base_colours = np.asarray(SHAPE_COLOURS, dtype=np.float32)[rng.integers(len(SHAPE_COLOURS), size=n_images)]
        _stamp_shapes(rng, canvas, centres_x, centres_y, base_colours, drawn=slot < counts)

    canvas += rng.normal(0.0, pixel_noise_std, size=canvas.shape).astype(np.float32)
    images = np.clip(np.rint(canvas), 0, 255).astype(np.uint8)
    return ShapesDataset(images=images, labels=labels, class_names=class_names)


def _stamp_shapes(
    rng: np.random.Generator,
    canvas: np.ndarray,
    centres_x: np.ndarray,
    centres_y: np.ndarray,
    base_colours: np.ndarray,
    drawn: np.ndarray,
) -> None:
    """Paint one shape of random kind, size and shade into each image where ``drawn`` is true."""
    n = canvas.shape[0]
    kinds = rng.integers(len(SHAPE_KINDS), size=n)
    half_sizes = rng.uniform(*HALF_SIZE_RANGE, size=n)
    colours = base_colours + rng.uniform(-COLOUR_JITTER, COLOUR_JITTER, size=(n, 3))

    offsets = np.arange(-STAMP_RADIUS, STAMP_RADIUS + 1)
    cols = np.floor(centres_x).astype(np.int64)[:, None] + offsets  # (n, window)
    rows = np.floor(centres_y).astype(np.int64)[:, None] + offsets
    dx = (cols - centres_x[:, None])[:, None, :]  # (n, 1, window)
    dy = (rows - centres_y[:, None])[:, :, None]  # (n, window, 1)
    inside = _shape_masks(dx, dy, half_sizes[:, None, None])[kinds, np.arange(n)]  # (n, window, window)
    inside &= drawn[:, None, None]

    image_index = np.arange(n)[:, None, None]
    pixels = (image_index, rows[:, :, None], cols[:, None, :])
    canvas[pixels] = np.where(inside[..., None], colours[:, None, None, :].astype(np.float32), canvas[pixels])


def _shape_masks(dx: np.ndarray, dy: np.ndarray, half_size: np.ndarray) -> np.ndarray:
    """Inside-masks of every kind, stacked in SHAPE_KINDS order: (len(SHAPE_KINDS), n, window, window)."""
    abs_x, abs_y = np.abs(dx), np.abs(dy)
    bar_half_width = half_size / 3
    masks = {
        "square": np.maximum(abs_x, abs_y) <= half_size,
        "circle": dx**2 + dy**2 <= half_size**2,
        "triangle": (abs_y <= half_size) & (abs_x <= (dy + half_size) / 2),  # apex up, base down
        "cross": ((abs_x <= bar_half_width) & (abs_y <= half_size))
        | ((abs_y <= bar_half_width) & (abs_x <= half_size)),
        "diamond": abs_x + abs_y <= half_size,
    }
    return np.stack([masks[kind] for kind in SHAPE_KINDS])
