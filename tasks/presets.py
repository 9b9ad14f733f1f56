"""Named real-data task settings: ``task: wikitext103`` expands to a preset's ``task:`` mapping.

Keys given next to a preset name refine it (``task: {name: wikitext103, seq_len: 512}``). The
preset name becomes the task's label, the row name in summaries. Hub presets download on
first use and come from the HF cache afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TaskPreset:
    description: str
    task: dict[str, Any]


TASK_PRESETS: dict[str, TaskPreset] = {}


def _register(name: str, description: str, task: dict[str, Any]) -> None:
    TASK_PRESETS[name] = TaskPreset(description, task)


_register(
    "wikitext103",
    "WikiText-103 (raw), GPT-2 BPE; 103M training tokens (HF hub, downloaded on first use)",
    {
        "name": "lm_text",
        "data": {"hf_path": "Salesforce/wikitext", "hf_name": "wikitext-103-raw-v1", "end_of_document": False},
    },
)
_register(
    "wikitext2",
    "WikiText-2 (raw), GPT-2 BPE; 2M training tokens (HF hub, downloaded on first use)",
    {
        "name": "lm_text",
        "data": {"hf_path": "Salesforce/wikitext", "hf_name": "wikitext-2-raw-v1", "end_of_document": False},
    },
)
_register(
    "tinystories",
    "TinyStories, GPT-2 BPE, end-of-text between stories (HF hub, downloaded on first use)",
    {"name": "lm_text", "data": {"hf_path": "roneneldan/TinyStories"}},
)
_register(
    "multi30k_de_en",
    "Multi30k German->English image captions, 29k training pairs (HF hub, downloaded on first use)",
    {
        "name": "translation_text",
        "data": {"hf_path": "bentrevett/multi30k", "source_lang": "de", "target_lang": "en"},
        "tokenizer": {"compact_vocab": True},
    },
)
_register(
    "wmt14_de_en",
    "WMT14 German->English news, 4.5M training pairs, newstest2013 for validation (HF hub, downloaded on first use)",
    {
        "name": "translation_text",
        "data": {"hf_path": "wmt/wmt14", "hf_name": "de-en", "source_lang": "de", "target_lang": "en"},
    },
)
_register(
    "cifar10",
    "CIFAR-10, 50k/10k 32x32 RGB images, 10 classes (HF hub uoft-cs/cifar10, downloaded on first use)",
    {
        "name": "image_classification",
        "image_size": 32,
        "data": {
            "source": "hf",
            "hf_path": "uoft-cs/cifar10",
            "image_field": "img",
            "label_field": "label",
            "val_split": "test",
        },
    },
)
_register(
    "cifar100",
    "CIFAR-100, 50k/10k 32x32 RGB images, 100 fine classes (HF hub uoft-cs/cifar100, downloaded on first use)",
    {
        "name": "image_classification",
        "image_size": 32,
        "data": {
            "source": "hf",
            "hf_path": "uoft-cs/cifar100",
            "image_field": "img",
            "label_field": "fine_label",
            "val_split": "test",
        },
    },
)
