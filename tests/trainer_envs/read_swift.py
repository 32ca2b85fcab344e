"""Run by ms-swift's side environment: load JSON Lines files through ms-swift's own dataset code and print,
per file and row, the text it trains on and a digest of each image as its loader reads it (JSON on
stdout's last line). Grounding rows have their `objects` put into the replies by the Qwen2.5-VL template's
own steps: boxes rescaled to the image it is sent (`normalize_bbox`), each ``<bbox>`` tag written out
(`replace_bbox`, in the ``QWENVL_BBOX_FORMAT=new`` format).

    ROOT_IMAGE_DIR=DIR python read_swift.py FILE.jsonl[,FILE.jsonl...]
"""

import json
import sys
import types

from image_digest import image_digests
from swift.dataset import load_dataset
from swift.template.template_inputs import StdTemplateInputs
from swift.template.templates.qwen import Qwen2_5VLTemplate
from swift.template.vision_utils import load_image

BBOX = "<bbox>"


def with_boxes(messages: list[dict], objects: dict, images: list) -> list[dict]:
    """The replies with each ``<bbox>`` tag written out as the Qwen2.5-VL template writes it."""
    if not objects or not objects.get("bbox"):
        return messages
    inputs = StdTemplateInputs(messages=messages, images=images, objects=json.loads(json.dumps(objects)))
    template = types.SimpleNamespace(norm_bbox=Qwen2_5VLTemplate.norm_bbox, bbox_format="new")
    Qwen2_5VLTemplate._get_height_width(inputs)
    Qwen2_5VLTemplate.normalize_bbox(template, inputs)
    written = iter(
        "".join(Qwen2_5VLTemplate.replace_bbox(template, box, k, inputs))
        for k, box in enumerate(inputs.objects["bbox"])
    )
    out = []
    for message in messages:
        parts = message["content"].split(BBOX)
        content = parts[0] + "".join(next(written) + part for part in parts[1:])
        out.append({"role": message["role"], "content": content})
    return out


def main() -> None:
    out = {}
    for path in sys.argv[1].split(","):
        train, _ = load_dataset([path])
        rows = []
        for row in train:
            images = [load_image(image["path"] if isinstance(image, dict) else image) for image in row["images"] or []]
            tags = sum(m["content"].count("<image>") for m in row["messages"])
            assert tags == len(images), f"{tags} <image> tags, {len(images)} images"
            messages = with_boxes(row["messages"], row.get("objects"), images)
            rows.append(
                {
                    "messages": messages,
                    "images": image_digests(images),
                }
            )
        out[path] = rows
    print(json.dumps(out))


if __name__ == "__main__":
    main()
