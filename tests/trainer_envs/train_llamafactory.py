"""Run by LLaMA-Factory's side environment: one step of LLaMA-Factory's own SFT loop (`run_exp`) on CPU,
on a dataset of a `convert --to llamafactory` folder; prints the trainer state as JSON on stdout's last line.

    python train_llamafactory.py MODEL_DIR TEMPLATE DATASET_DIR DATASET OUTPUT_DIR

torchaudio is stood in for as in `read_llamafactory.py` (imported for audio alone).
"""

import importlib.machinery
import json
import sys
import types
from pathlib import Path

audio = types.ModuleType("torchaudio")
audio.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
sys.modules["torchaudio"] = audio

from llamafactory.train.tuner import run_exp  # noqa: E402


def main() -> None:
    model, template, dataset_dir, dataset, output_dir = sys.argv[1:6]
    run_exp(
        {
            "model_name_or_path": model,
            "template": template,
            "stage": "sft",
            "do_train": True,
            "finetuning_type": "full",
            "dataset_dir": dataset_dir,
            "dataset": dataset,
            "cutoff_len": 1024,
            "max_steps": 1,
            "per_device_train_batch_size": 2,
            "learning_rate": 1e-3,
            "output_dir": output_dir,
            "overwrite_output_dir": True,
            "save_strategy": "no",
            "report_to": "none",
            "use_cpu": True,
            "bf16": False,
        }
    )
    state = json.loads((Path(output_dir) / "trainer_state.json").read_text())
    print(json.dumps({"global_step": state["global_step"], "log_history": state["log_history"]}))


if __name__ == "__main__":
    main()
