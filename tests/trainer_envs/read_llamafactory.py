"""Run by LLaMA-Factory's side environment: load datasets through LLaMA-Factory's own dataset code and
print, per dataset and row, the text it trains on and a digest of each image as its Qwen2-VL plugin
sends it to the processor (JSON on stdout's last line).

    python read_llamafactory.py DATASET_DIR NAME[,NAME...] MAX_PIXELS MIN_PIXELS

torchaudio is stood in for by an empty module: LLaMA-Factory's multimodal plugin imports it at load
time for audio alone, and no torchaudio build on PyPI loads beside the local CPU torch (2.13).
"""

import importlib.machinery
import json
import sys
import types

audio = types.ModuleType("torchaudio")
audio.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
sys.modules["torchaudio"] = audio

from image_digest import image_digests  # noqa: E402
from llamafactory.data.loader import _get_merged_dataset  # noqa: E402
from llamafactory.data.mm_plugin import get_mm_plugin  # noqa: E402
from llamafactory.hparams import DataArguments, ModelArguments  # noqa: E402
from transformers import Seq2SeqTrainingArguments  # noqa: E402


def main() -> None:
    dataset_dir, names, max_pixels, min_pixels = sys.argv[1], sys.argv[2].split(","), *map(int, sys.argv[3:5])
    data_args = DataArguments(dataset_dir=dataset_dir, dataset=",".join(names))
    model_args = ModelArguments(model_name_or_path="unused", image_max_pixels=max_pixels, image_min_pixels=min_pixels)
    training_args = Seq2SeqTrainingArguments(output_dir=dataset_dir + "/unused", report_to="none")
    plugin = get_mm_plugin("qwen2_vl", image_token="<|image_pad|>")
    loaded = _get_merged_dataset(names, model_args, data_args, training_args, stage="sft", return_dict=True)
    out = {}
    for name, dataset in loaded.items():
        rows = []
        for row in dataset:
            messages = row["_prompt"] + row["_response"]
            plugin._validate_messages(messages, row["_images"] or [], [], [])
            images = plugin._regularize_images(
                row["_images"] or [], image_max_pixels=max_pixels, image_min_pixels=min_pixels
            )["images"]
            rows.append(
                {
                    "system": row["_system"],
                    "messages": messages,
                    "images": image_digests(images),
                }
            )
        out[name] = rows
    print(json.dumps(out))


if __name__ == "__main__":
    main()
