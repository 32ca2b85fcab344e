"""The `sft` config: rows that TRL's `SFTTrainer` takes as they are.

TRL's conversational vision format is an image column (`image`, or `images` for several)
and a `messages` column of chat turns whose content is a list of `{"type": "image"}` /
`{"type": "text", "text": ...}` parts. The build writes `messages` into the same shards
as the typed columns, made by the same prompt functions the recipes use
(`gemex_dataset.prompts`, `rexvqa_dataset.prompts`), so the `sft` config costs no second
copy of any image: it names the same files as `default`.
"""

from __future__ import annotations

from datasets import List, Value

MESSAGES = List({"role": Value("string"), "content": List({"type": Value("string"), "text": Value("string")})})
"""Chat turns; every content part has both keys (`text` is null for an image part), so the column is one Arrow type."""


def chat_messages(instruction: str, question: str, images: int, target: str | None, fold_system: bool = False) -> list[dict]:
    """System instruction, a user turn of `images` image parts then the question, and the target reply.

    `fold_system` puts the instruction at the start of the user's text instead, for chat
    templates that reject a system role; `target=None` leaves the reply out (generation).
    """
    messages: list[dict] = []
    if fold_system:
        question = f"{instruction}\n{question}"
    else:
        messages.append({"role": "system", "content": [_text(instruction)]})
    messages.append({"role": "user", "content": [{"type": "image", "text": None} for _ in range(images)] + [_text(question)]})
    if target is not None:
        messages.append({"role": "assistant", "content": [_text(target)]})
    return messages


def _text(text: str) -> dict:
    return {"type": "text", "text": text}
