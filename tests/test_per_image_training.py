"""Training on one conversation per image (GEMeX `sft_per_image`, ReXVQA `sft_per_study`) with tiny
offline models (tests/tiny_models.py) and real small builds: TRL's own path as its unmodified
`examples/scripts/sft_vlm.py` takes it (the config's rows, SFTTrainer, its vision collator), the
loss mask on every assistant turn and no other, and the bundled recipe's `--layout per_image` for
GEMeX, ReXVQA and their mixture."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("peft")

from datasets import load_dataset  # noqa: E402
from trl import ModelConfig, SFTTrainer  # noqa: E402

from builders.assembly.settings import BuildSettings  # noqa: E402
from rexvqa_dataset.build import build_rexvqa  # noqa: E402
from rexvqa_dataset.synthetic.release import generate as generate_rexvqa  # noqa: E402
from training_recipes import data, sft  # noqa: E402

from . import tiny_models  # noqa: E402
from .test_recipes import END_OF_TURN, sft_config, training_collator  # noqa: E402

CONVERSATION_TOKENS = 300
"""Short rows for the tiny models' 2,048 positions; also cuts the synthetic images' conversations."""


@pytest.fixture(scope="module")
def gemex_built(gemex_embed_112) -> Path:
    return gemex_embed_112


@pytest.fixture(scope="module")
def rexvqa_built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("per-study")
    release = generate_rexvqa(root / "release", num_studies=12, seed=5)
    build_rexvqa(
        BuildSettings(
            source=release.root,
            out=root / "rexvqa",
            image_mode="embed",
            image_size=112,
            conversation_tokens=CONVERSATION_TOKENS,
        )
    )
    return root / "rexvqa"


BUILT = {"gemex": ("gemex_built", "sft_per_image"), "rexvqa": ("rexvqa_built", "sft_per_study")}


def replies(messages: list[dict]) -> list[str]:
    return [
        "".join(p["text"] for p in m["content"] if p["type"] == "text") for m in messages if m["role"] == "assistant"
    ]


def trained_runs(labels: torch.Tensor, tokenizer) -> list[str]:
    """The text of each run of consecutive trained positions (labels != -100)."""
    positions = (labels != -100).nonzero().flatten().tolist()
    runs, start = [], None
    for k, position in enumerate(positions):
        start = position if start is None else start
        if k + 1 == len(positions) or positions[k + 1] != position + 1:
            runs.append(tokenizer.decode(labels[start : position + 1]).strip())
            start = None
    return runs


@pytest.mark.parametrize("dataset", list(BUILT))
@pytest.mark.parametrize("assistant_only_loss", [False, True])
def test_trls_sft_vlm_path_trains_on_the_conversation_config(dataset, assistant_only_loss, request, tmp_path):
    """As `sft_vlm.py` does: `load_dataset(name, config)`, no `max_length`, SFTTrainer's own collator (`--assistant_only_loss` or not)."""
    fixture, config = BUILT[dataset]
    vlm = tiny_models.tiny_vlm("qwen2_5_vl")
    train = load_dataset(str(request.getfixturevalue(fixture)), config)["train"].select(range(4))
    args = sft_config(
        tmp_path, max_steps=2, max_length=None, assistant_only_loss=assistant_only_loss, per_device_train_batch_size=2
    )
    trainer = SFTTrainer(model=vlm.model, processing_class=vlm.processor, train_dataset=train, args=args)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))


@pytest.mark.parametrize("dataset", list(BUILT))
def test_trls_collator_trains_every_assistant_turn_of_the_stored_rows(dataset, request):
    fixture, config = BUILT[dataset]
    vlm = tiny_models.tiny_vlm("qwen2_5_vl")
    rows = load_dataset(str(request.getfixturevalue(fixture)), config, split="train").select(range(3))
    assert max(len(ids) for ids in rows["question_ids"]) > 1  # conversations, not single questions
    batch = training_collator(vlm.processor)([dict(row) for row in rows])
    for i, row in enumerate(rows):
        expected = [f"{reply}{END_OF_TURN['qwen2_5_vl']}" for reply in replies(row["messages"])]
        assert len(expected) == len(row["question_ids"]) > 0
        assert trained_runs(batch["labels"][i], vlm.processor.tokenizer) == expected


@pytest.mark.parametrize("family", tiny_models.FAMILIES)
@pytest.mark.parametrize("dataset", list(BUILT))
def test_recipe_loss_mask_covers_every_reply_and_nothing_else(family, dataset, request):
    """The recipe writes the turns again for the model (its box convention, its system-turn rule); every reply is trained, no prompt."""
    fixture, config = BUILT[dataset]
    vlm = tiny_models.tiny_vlm(family)
    settings = data.settings_for(vlm.model.config.model_type, vlm.processor)
    rows = load_dataset(str(request.getfixturevalue(fixture)), config, split="train").select(range(3))
    assert max(len(ids) for ids in rows["question_ids"]) > 1
    examples = data.conversational(rows, settings)
    batch = training_collator(vlm.processor)([examples[i] for i in range(3)])
    for i in range(3):
        messages = examples[i]["messages"]
        expected = [f"{reply}{END_OF_TURN[family]}" for reply in replies(messages)]
        assert len(expected) == len(rows[i]["question_ids"])
        assert trained_runs(batch["labels"][i], vlm.processor.tokenizer) == expected
        assert len(examples[i]["images"]) == sum(p["type"] == "image" for m in messages for p in m["content"])


@pytest.mark.parametrize("dataset", list(BUILT))
def test_conversation_turns_are_the_per_question_turns_in_the_models_box_convention(dataset, request):
    """Qwen2.5-VL's boxes follow its resize: each reply of a conversation row is the reply the recipe
    writes for the same question from the per-question `sft` row."""
    fixture, config = BUILT[dataset]
    folder = str(request.getfixturevalue(fixture))
    vlm = tiny_models.tiny_vlm("qwen2_5_vl")
    settings = data.settings_for("qwen2_5_vl", vlm.processor)
    questions = data.conversational(load_dataset(folder, "sft", split="train"), settings)
    ids = load_dataset(folder, "sft", split="train")["question_id"]
    per_question = {q: replies(questions[k]["messages"])[0] for k, q in enumerate(ids)}
    rows = load_dataset(folder, config, split="train")
    conversations = data.conversational(rows, settings)
    for k in range(len(rows)):
        assert replies(conversations[k]["messages"]) == [per_question[q] for q in rows[k]["question_ids"]]
    if dataset == "gemex":
        assert any("<location> [[" in reply for reply in per_question.values())


def test_recipe_trains_either_layout_for_gemex_rexvqa_and_the_mixture(gemex_built, rexvqa_built, tmp_path):
    vlm = tiny_models.tiny_vlm("qwen2_5_vl")
    runs = {
        "gemex": sft.DataArguments(gemex_path=str(gemex_built), layout="per_image", max_train_samples=4),
        "rexvqa": sft.DataArguments(rexvqa_path=str(rexvqa_built), layout="per_image", max_train_samples=4),
        "mixture": sft.DataArguments(gemex_path=str(gemex_built), rexvqa_path=str(rexvqa_built), layout="per_image"),
        "per_question": sft.DataArguments(gemex_path=str(gemex_built), layout="per_question", max_train_samples=4),
    }
    for name, data_args in runs.items():
        trainer = sft.train(
            data_args,
            sft_config(tmp_path / name, max_steps=2, per_device_train_batch_size=2),
            ModelConfig(),
            vlm.model,
            vlm.processor,
        )
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        assert trainer.state.global_step == 2 and all(torch.isfinite(torch.tensor(losses))), name


def test_layout_picks_the_config():
    assert data.layout_config("gemex", "per_image", None) == "sft_per_image"
    assert data.layout_config("rexvqa", "per_image", None) == "sft_per_study"
    assert data.layout_config("gemex", "per_question", "multi_choice") == "multi_choice"
    with pytest.raises(ValueError, match="per_image layout reads 'sft_per_image'"):
        data.layout_config("gemex", "per_image", "multi_choice")
    with pytest.raises(ValueError, match="expected one of per_question, per_image"):
        data.layout_config("gemex", "per_turn", None)
