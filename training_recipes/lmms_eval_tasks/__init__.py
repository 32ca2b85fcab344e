"""lmms-eval tasks for GEMeX and ReXVQA: pass this folder as lmms-eval's ``--include_path``.

The task files only wire lmms-eval to the package: prompts come from
`gemex_dataset.prompts` / `rexvqa_dataset.prompts` (through `training_recipes.data`, as the
recipes train and generate), scores from `gemex_dataset.scoring` / `rexvqa_dataset.scoring`, so a
number lmms-eval prints is the number ``cxr-vqa evaluate`` prints for the same replies.
"""

from pathlib import Path

TASKS_DIR = Path(__file__).parent
"""The folder to pass as ``--include_path``."""
