"""Seconds from start to the first new step of a streamed recipe run: fresh, and resumed at 80% of a
small epoch from its checkpoint (`--resume_from_checkpoint auto`). A resumed stream loads its saved
data loader state rather than reading and decoding the rows of the steps already trained, so the
two should be close (target: resumed <= 1.5 x fresh); the rows read and images decoded before the
first new step are counted too.

    python -m benchmarks.resume_stream                    # tiny Gemma 3 on CPU, a synthetic GEMeX build
    python -m benchmarks.resume_stream --rows 800 --batch_size 4
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=400, help="Training questions of the synthetic build (one epoch).")
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--image_size", type=int, default=224, help="Long side of the built images.")
    parser.add_argument(
        "--resume_at", type=float, default=0.8, help="Share of the epoch trained before the checkpoint."
    )
    parser.add_argument("--workdir", default="/tmp/cxr-vqa-resume")
    parser.add_argument("--output_json", default=None)
    return parser.parse_args(argv)


def first_step(argv: list[str]) -> dict:
    """Run `sft.main(argv)` until its first step ends; seconds to it, rows read and images decoded by then."""
    from training_recipes import data, sft
    from training_recipes.runtime import preemption

    counts = {"read": 0, "decoded": 0}
    started = time.perf_counter()
    decode, ids_of, step_end = data.decode_image, data.question_ids, preemption.Preemption.on_step_end

    class FirstStep(Exception):
        pass

    def counting_decode(*args, **kwargs):
        counts["decoded"] += 1
        return decode(*args, **kwargs)

    def counting_ids(row):
        counts["read"] += 1
        return ids_of(row)

    def stop(self, args, state, control, **kwargs):
        counts["seconds"] = time.perf_counter() - started
        counts["step"] = state.global_step
        raise FirstStep

    data.decode_image, data.question_ids, preemption.Preemption.on_step_end = counting_decode, counting_ids, stop
    try:
        sft.main(argv)
    except FirstStep:
        pass
    finally:
        data.decode_image, data.question_ids, preemption.Preemption.on_step_end = decode, ids_of, step_end
    return counts


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    from train_throughput import build_synthetic_gemex

    from training_recipes import sft, tiny_model

    workdir = Path(args.workdir)
    built = build_synthetic_gemex(workdir, args.rows, args.image_size)
    model = str(tiny_model.save_tiny_vlm("gemma3", workdir / "gemma3"))
    steps = args.rows // args.batch_size
    at = int(steps * args.resume_at)
    output_dir = workdir / "run"
    shutil.rmtree(output_dir, ignore_errors=True)
    common = [
        "--model_name_or_path",
        model,
        "--gemex_path",
        str(built),
        "--streaming",
        "--max_train_samples",
        str(args.rows),
        "--output_dir",
        str(output_dir),
        "--per_device_train_batch_size",
        str(args.batch_size),
        "--max_steps",
        str(steps),
        "--save_strategy",
        "steps",
        "--save_steps",
        str(at),
        "--seed",
        "0",
        "--bf16",
        "false",
        "--use_cpu",
        "true",
        "--dtype",
        "float32",
        "--gradient_checkpointing",
        "false",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
    ]
    sft.main([*common, "--max_steps", str(at)])  # trains to the checkpoint at `at`
    fresh = first_step([*common, "--output_dir", str(workdir / "fresh")])
    resumed = first_step([*common, "--resume_from_checkpoint", "auto"])
    result = {
        "rows": args.rows,
        "steps": steps,
        "resumed_at_step": at,
        "fresh": fresh,
        "resumed": resumed,
        "resumed_over_fresh": round(resumed["seconds"] / fresh["seconds"], 2),
    }
    print(
        f"first new step: fresh {fresh['seconds']:.1f} s ({fresh['read']} rows read, {fresh['decoded']} images decoded), "
        f"resumed at step {at} of {steps}: {resumed['seconds']:.1f} s ({resumed['read']} read, {resumed['decoded']} decoded), "
        f"{result['resumed_over_fresh']}x"
    )
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
