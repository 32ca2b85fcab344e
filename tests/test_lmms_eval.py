"""lmms-eval runs the shipped GEMeX and ReXVQA tasks (`training_recipes/lmms_eval_tasks`, passed as
its include path) on demo builds with the tiny offline Qwen2.5-VL, and the numbers it reports equal
``cxr-vqa evaluate`` on the replies it logged.

lmms-eval lives in its own environment (docs/evaluation.md, "Evaluate with lmms-eval"); without it these
tests skip and say so. Two stand-ins, each for a package this machine cannot import, neither for
code under test: torchvision has no PyPI build that imports beside torch 2.13 CPU, so
(1) `qwen_vl_utils`, which imports it at the top for video, cannot load, and lmms-eval's
Qwen2.5-VL wrapper is given an image-only `process_vision_info` that hands the images to the
processor as they are (the processor resizes them), and (2) the tiny model's processor is
tests/tiny_models.py's image-only Qwen2.5-VL processor, registered so `AutoProcessor` loads it
from the saved folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip(
    "lmms_eval", reason="lmms-eval is not installed: pip install -e '.[lmms]' && pip install --no-deps lmms-eval==0.7.3"
)
pytest.importorskip("transformers")

from builders.scoring.text_metrics import installed_metrics
from cxr_vqa import cli
from cxr_vqa.evaluate import load_split
from gemex_dataset import scoring as gemex_scoring
from gemex_dataset.prompts import type_prompt
from rexvqa_dataset import scoring as rexvqa_scoring
from rexvqa_dataset.features import TASK_CONFIGS, TASKS
from training_recipes import data
from training_recipes.lmms_eval_tasks import TASKS_DIR

from . import tiny_models

GEMEX_TASKS = {
    "gemex_open": "open_ended",
    "gemex_closed": "closed_ended",
    "gemex_single_choice": "single_choice",
    "gemex_multi_choice": "multi_choice",
}
REXVQA_TASKS = {f"rexvqa_{config}": task for config, task in zip(TASK_CONFIGS, TASKS)}
TEXT_METRICS = installed_metrics()[0]
FLOAT32 = 1e-4
"""BERTScore embeds in float32 batches, and a task's batches pad differently from the whole split's."""


def tolerance(metric: str) -> float:
    return FLOAT32 if metric == "bertscore" else 1e-9


def image_only_process_vision_info(conversations, return_video_kwargs=False, return_video_metadata=False):
    """`qwen_vl_utils.process_vision_info` for images only: each image part's image, in order."""
    images = [
        part["image"]
        for conversation in conversations
        for message in conversation
        for part in message["content"]
        if part.get("type") == "image"
    ]
    return (images or None, None, {}) if return_video_kwargs else (images or None, None)


@pytest.fixture(scope="module")
def lmms(tmp_path_factory):
    """lmms-eval with the two stand-ins in place, and the tiny model saved as a Hub checkpoint looks."""
    import lmms_eval.models.chat.qwen2_5_vl as qwen_wrapper
    from transformers import AutoProcessor, Qwen2_5_VLConfig

    AutoProcessor.register(Qwen2_5_VLConfig, tiny_models.image_only_qwen2_5_vl_processor_class(), exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(qwen_wrapper, "process_vision_info", image_only_process_vision_info)
        yield tiny_models.save_tiny_vlm("qwen2_5_vl", tmp_path_factory.mktemp("model") / "qwen2_5_vl")


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """`cxr-vqa demo`'s builds; ReXVQA from 60 studies with the five tasks in equal shares, so that every
    task has test questions (at the paper's mix a geometric question is 1 in 250, and the test split 6%)."""
    from cxr_vqa.demo import run_demo, run_rexvqa_demo

    out = tmp_path_factory.mktemp("demo")
    run_demo(out, num_images=12)
    run_rexvqa_demo(out, num_studies=60, task_shares=dict.fromkeys(TASKS, 0.2))
    return out


@pytest.fixture
def datasets_env(demo, monkeypatch):
    monkeypatch.setenv("CXR_VQA_GEMEX", str(demo / "gemex"))
    monkeypatch.setenv("CXR_VQA_REXVQA", str(demo / "rexvqa"))
    monkeypatch.delenv("CXR_VQA_BOX_CONVENTION", raising=False)
    return monkeypatch


def task_manager():
    from lmms_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASKS_DIR), include_defaults=False)


def load_tasks(names: list[str], task_type: str = "chat") -> dict:
    from lmms_eval.tasks import get_task_dict

    return get_task_dict(names, task_manager(), task_type)


def run_lmms_eval(model_dir: Path, tasks: list[str]) -> dict:
    from lmms_eval.evaluator import simple_evaluate

    return simple_evaluate(
        model="qwen2_5_vl",
        model_args=f"pretrained={model_dir},device=cpu,device_map=cpu,min_pixels=3136,max_pixels=3136",
        tasks=tasks,
        task_manager=task_manager(),
        gen_kwargs="max_new_tokens=24",
        batch_size=2,
        log_samples=True,
    )


def logged_replies(output: dict, path: Path) -> Path:
    """The replies lmms-eval logged, as the predictions file `cxr-vqa evaluate` reads."""
    with path.open("w") as handle:
        for samples in output["samples"].values():
            for sample in samples:
                handle.write(
                    json.dumps({"question_id": sample["doc"]["question_id"], "prediction": sample["filtered_resps"][0]})
                    + "\n"
                )
    return path


def cxr_vqa_evaluate(benchmark: str, dataset: Path, out: Path, *options: str) -> dict:
    assert cli.main(["evaluate", str(dataset), "--benchmark", benchmark, "--out", str(out), *options]) == 0
    return json.loads(out.read_text())["scores"]


def test_the_include_path_holds_a_task_per_type_and_task_and_the_two_groups():
    names = set(task_manager().all_tasks)
    assert set(GEMEX_TASKS) | set(REXVQA_TASKS) | {"gemex", "rexvqa"} <= names


def test_a_task_without_its_dataset_variable_says_which_to_set(datasets_env):
    datasets_env.delenv("CXR_VQA_GEMEX")
    with pytest.raises(RuntimeError, match="CXR_VQA_GEMEX is not set"):
        load_tasks(["gemex_open"])
    assert load_tasks(["rexvqa_presence_assessment"])  # the other dataset's variable is enough for its tasks


def test_the_model_is_asked_what_the_recipes_train_on(datasets_env):
    tasks = load_tasks(["gemex_multi_choice", "rexvqa_presence_assessment"])
    settings = data.ConversationSettings()
    for name, kind in (("gemex_multi_choice", "gemex"), ("rexvqa_presence_assessment", "rexvqa")):
        task = tasks[name]
        for doc in task.test_docs():
            messages = task.doc_to_messages(doc)
            expected = data.to_messages(dict(doc), kind, settings, with_answer=False)
            assert [m["role"] for m in messages] == [m["role"] for m in expected] == ["system", "user"]
            assert [[p.get("text") for p in m["content"]] for m in messages] == [
                [p["text"] for p in m["content"]] for m in expected
            ]
            images = [p["url"] for p in messages[1]["content"] if p["type"] == "image"]
            stored = [doc["image"]] if kind == "gemex" else doc["images"]
            assert [image.size for image in images] == [image.size for image in stored] and all(
                i.mode == "RGB" for i in images
            )
    assert any(len(doc["images"]) > 1 for doc in tasks["rexvqa_presence_assessment"].test_docs())  # multi-image studies


def test_simple_models_get_the_instruction_folded_into_the_question(datasets_env):
    task = load_tasks(["gemex_closed"], task_type="simple")["gemex_closed"]
    doc = task.test_docs()[0]
    assert task.doc_to_text(doc) == f"{type_prompt('closed_ended')}\n{doc['question']}"
    assert [image.size for image in task.doc_to_visual(doc)] == [doc["image"].size]


def test_gemex_scores_equal_cxr_vqa_evaluate_on_the_logged_replies(lmms, demo, datasets_env, tmp_path):
    box_convention = "qwen2.5-vl"
    datasets_env.setenv("CXR_VQA_BOX_CONVENTION", box_convention)
    output = run_lmms_eval(lmms, ["gemex"])
    predictions = logged_replies(output, tmp_path / "replies.jsonl")
    expected = cxr_vqa_evaluate(
        "gemex",
        demo / "gemex",
        tmp_path / "scores.json",
        "--predictions",
        str(predictions),
        "--box-convention",
        box_convention,
    )
    results = output["results"]
    for task, question_type in GEMEX_TASKS.items():
        row = expected[question_type]
        metrics = (["A"] if question_type in gemex_scoring.ANSWERED_TYPES else []) + ["V", *TEXT_METRICS]
        assert "A,none" in results[task] if question_type != "open_ended" else "A,none" not in results[task]
        for metric in metrics:
            assert results[task][f"{metric},none"] == pytest.approx(row[metric], abs=tolerance(metric)), (task, metric)
    everything = expected["all"]
    assert sum(len(s) for s in output["samples"].values()) == everything["questions"]
    for metric in ["A", "V", *TEXT_METRICS]:  # every demo question has boxes, so V's weights are the types' sizes
        assert results["gemex"][f"{metric},none"] == pytest.approx(
            everything[metric], abs=max(tolerance(metric), 1e-6)
        ), metric


def test_rexvqa_scores_equal_cxr_vqa_evaluate_on_the_logged_replies(lmms, demo, datasets_env, tmp_path):
    output = run_lmms_eval(lmms, ["rexvqa"])
    predictions = logged_replies(output, tmp_path / "replies.jsonl")
    expected = cxr_vqa_evaluate("rexvqa", demo / "rexvqa", tmp_path / "scores.json", "--predictions", str(predictions))
    results = output["results"]
    assert set(expected["per_task"]) == set(TASKS)
    for task, name in REXVQA_TASKS.items():
        assert results[task]["accuracy,none"] == pytest.approx(expected["per_task"][name]["accuracy"], abs=1e-12)
    assert results["rexvqa"]["accuracy,none"] == pytest.approx(expected["overall"]["accuracy"], abs=1e-12)
    assert sum(len(s) for s in output["samples"].values()) == expected["overall"]["questions"]


def score_through_task(task, replies: dict[str, str]) -> dict:
    """`replies` scored the way lmms-eval scores a task: process_results per question, then each
    metric's aggregation over the items."""
    items: dict[str, list] = {}
    for doc in task.test_docs():
        for metric, item in task.process_results(doc, [replies[doc["question_id"]]]).items():
            items.setdefault(metric, []).append(item)
    return {metric: task.aggregation()[metric](values) for metric, values in items.items()}


def test_gemex_tasks_score_baseline_replies_as_cxr_vqa_evaluate_does(demo, datasets_env, tmp_path):
    """Replies with right answers and boxes (lmms-eval's tiny-model run scores near zero):
    `cxr-vqa evaluate --baseline` numbers, and the same replies through the tasks' own functions."""
    datasets_env.setenv("CXR_VQA_BOX_CONVENTION", "norm1000")
    tasks = load_tasks(list(GEMEX_TASKS))
    for baseline in ("random", "majority"):
        expected = cxr_vqa_evaluate(
            "gemex",
            demo / "gemex",
            tmp_path / f"{baseline}.json",
            "--baseline",
            baseline,
            "--box-convention",
            "norm1000",
        )
        rows = load_split(
            demo / "gemex", "test", gemex_scoring.COLUMNS, ()
        )  # as evaluate reads them: same seeded draws
        make = gemex_scoring.random_replies if baseline == "random" else gemex_scoring.majority_replies
        replies = make(rows, box_convention="norm1000")
        for name, question_type in GEMEX_TASKS.items():
            got = score_through_task(tasks[name], replies)
            for metric, value in got.items():
                assert value == pytest.approx(expected[question_type][metric], abs=tolerance(metric)), (
                    baseline,
                    name,
                    metric,
                )
        assert expected["multi_choice"]["V"] > 0 and expected["closed_ended"]["A"] > 0


def test_rexvqa_tasks_score_baseline_replies_as_cxr_vqa_evaluate_does(demo, datasets_env, tmp_path):
    expected = cxr_vqa_evaluate("rexvqa", demo / "rexvqa", tmp_path / "majority.json", "--baseline", "majority")
    tasks = load_tasks(list(REXVQA_TASKS))
    replies = rexvqa_scoring.majority_replies(load_split(demo / "rexvqa", "test", rexvqa_scoring.COLUMNS, ()))
    for name, task_name in REXVQA_TASKS.items():
        assert score_through_task(tasks[name], replies)["accuracy"] == pytest.approx(
            expected["per_task"][task_name]["accuracy"]
        )
    assert expected["overall"]["accuracy"] > 0
